// The parts of the _syncnorm module, each adding its classes and functions.
#ifndef SYNCNORM_CLIENT_PYTHON_SRC_BINDINGS_H_
#define SYNCNORM_CLIENT_PYTHON_SRC_BINDINGS_H_

#include "pybind11/pybind11.h"

namespace syncnorm::python {

// Client, NodeGroup, ThreadNode, PreciseBn: the service calls
// (bind_client.cc).
void BindClient(pybind11::module_& m);

// ThreadPool and the kernel entry points on raw tensors (bind_kernels.cc).
void BindKernels(pybind11::module_& m);

// Layer specs and the running-statistics rule (bind_rules.cc).
void BindRules(pybind11::module_& m);

}  // namespace syncnorm::python

#endif  // SYNCNORM_CLIENT_PYTHON_SRC_BINDINGS_H_
