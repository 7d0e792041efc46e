#include "client/python/src/py_status.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "client/contributor.h"
#include "pybind11/eval.h"

namespace py = pybind11;

namespace syncnorm::python {
namespace {

// The ServiceError class and its subclass for SINGLE_VALUE_PER_CHANNEL,
// created once at import and owned by the module (the one piece of module
// state; CPython modules keep their exception types this way).
PyObject* service_error = nullptr;
PyObject* single_value_error = nullptr;

}  // namespace

void RegisterErrors(py::module_& m) {
  py::object runtime_error =
      py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  py::dict ns;
  ns["RuntimeError"] = runtime_error;
  ns["__name__"] = m.attr("__name__");
  py::exec(R"(
class ServiceError(RuntimeError):
    """A call to the syncnorm aggregator failed.

    code is the gRPC status name ("DEADLINE_EXCEEDED", "INVALID_ARGUMENT",
    "NOT_FOUND", ...); str(error) is "CODE: message".
    """

    def __init__(self, message, code="UNKNOWN", reason=""):
        super().__init__(message)
        self.code = code
        self.reason = reason


class SingleValuePerChannelError(ServiceError, ValueError):
    """The group's global batch had one value per channel in training.

    A ValueError, as torch raises it ("Expected more than 1 value per
    channel when training"), and a ServiceError whose reason is
    "SINGLE_VALUE_PER_CHANNEL" (code FAILED_PRECONDITION when the
    aggregator refused the round).
    """
)",
           ns);
  m.attr("ServiceError") = ns["ServiceError"];
  m.attr("SingleValuePerChannelError") = ns["SingleValuePerChannelError"];
  service_error = py::object(ns["ServiceError"]).release().ptr();
  single_value_error =
      py::object(ns["SingleValuePerChannelError"]).release().ptr();
}

void ThrowIfError(const absl::Status& s) {
  if (s.ok()) return;
  const std::string message(s.message());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      throw py::value_error(message);
    default:
      throw std::runtime_error(message);
  }
}

void ThrowIfServiceError(const absl::Status& s) {
  if (s.ok()) return;
  const std::string code = absl::StatusCodeToString(s.code());
  const auto payload = s.GetPayload(kRoundErrorReasonUrl);
  const std::string reason = payload.has_value() ? std::string(*payload) : "";
  py::handle cls(reason == "SINGLE_VALUE_PER_CHANNEL" ? single_value_error
                                                      : service_error);
  py::object error = cls(absl::StrCat(code, ": ", s.message()), py::str(code),
                         py::str(reason));
  PyErr_SetObject(cls.ptr(), error.ptr());
  throw py::error_already_set();
}

}  // namespace syncnorm::python
