// absl::Status -> Python exceptions, one mapping for the whole binding.
#ifndef SYNCNORM_CLIENT_PYTHON_SRC_PY_STATUS_H_
#define SYNCNORM_CLIENT_PYTHON_SRC_PY_STATUS_H_

#include "absl/status/status.h"
#include "pybind11/pybind11.h"

namespace syncnorm::python {

// Adds ServiceError (a RuntimeError with a `code` attribute, the gRPC status
// name such as "DEADLINE_EXCEEDED", and a `reason`, RoundError.Reason's
// name or "") and its subclass SingleValuePerChannelError (also a
// ValueError, as torch raises it) to the module.
void RegisterErrors(pybind11::module_& m);

// Local errors (argument checks, kernels): INVALID_ARGUMENT and OUT_OF_RANGE
// raise ValueError, everything else RuntimeError. Does nothing for OK.
// REQUIRES: the GIL is held.
void ThrowIfError(const absl::Status& s);

// Errors of a call to the aggregator raise ServiceError with the status code
// name in `code`, the round's reason (kRoundErrorReasonUrl) in `reason` and
// "CODE: message" as the text; SingleValuePerChannelError for that reason.
// Does nothing for OK.
// REQUIRES: the GIL is held.
void ThrowIfServiceError(const absl::Status& s);

}  // namespace syncnorm::python

#endif  // SYNCNORM_CLIENT_PYTHON_SRC_PY_STATUS_H_
