// The _syncnorm extension module: the C++ client and kernels for Python.
// Tensors cross as (data pointer, shape, strides, dtype code, device code),
// so the module does not link libtorch. Every network wait and kernel runs
// with the GIL released.
#include "client/python/src/bindings.h"
#include "client/python/src/py_status.h"
#include "syncnorm_version.h"

PYBIND11_MODULE(_syncnorm, m) {
  m.doc() =
      "syncnorm's C++ client and batch-norm kernels (use the syncnorm "
      "package, not this module, directly)";
  // The project's version (VERSION), also syncnorm.__version__.
  m.attr("__version__") = syncnorm::kSyncnormVersion;
  syncnorm::python::RegisterErrors(m);
  syncnorm::python::BindClient(m);
  syncnorm::python::BindKernels(m);
  syncnorm::python::BindRules(m);
}
