#include "client/python/src/py_status.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "pybind11/eval.h"

namespace py = pybind11;

namespace syncnorm::python {
namespace {

// The ServiceError class, created once at import and owned by the module
// (the one piece of module state; CPython modules keep their exception
// types this way).
PyObject* service_error = nullptr;

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

    def __init__(self, message, code="UNKNOWN"):
        super().__init__(message)
        self.code = code
)",
           ns);
  m.attr("ServiceError") = ns["ServiceError"];
  service_error = py::object(ns["ServiceError"]).release().ptr();
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
  py::handle cls(service_error);
  py::object error = cls(absl::StrCat(code, ": ", s.message()), py::str(code));
  PyErr_SetObject(cls.ptr(), error.ptr());
  throw py::error_already_set();
}

}  // namespace syncnorm::python
