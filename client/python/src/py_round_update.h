// A forward round's update (kernels/round_update.h) from Python values.
#ifndef SYNCNORM_CLIENT_PYTHON_SRC_PY_ROUND_UPDATE_H_
#define SYNCNORM_CLIENT_PYTHON_SRC_PY_ROUND_UPDATE_H_

#include <cstddef>

#include "kernels/round_update.h"
#include "pybind11/pybind11.h"

namespace syncnorm::python {

// momentum: None or (mode code 1..3, value); imported: None or
// (num_batches_tracked, running_mean, running_var), the arrays of
// `channels` values. Raises ValueError for another shape or mode.
// REQUIRES: the GIL is held.
RoundUpdate RoundUpdateFrom(const pybind11::object& momentum,
                            const pybind11::object& imported, size_t channels);

}  // namespace syncnorm::python

#endif  // SYNCNORM_CLIENT_PYTHON_SRC_PY_ROUND_UPDATE_H_
