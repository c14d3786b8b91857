// Status <-> tierkv.Error: the exception classes live in Python
// (tierkv/_errors.py) so that they can derive from the built-in exceptions
// that mean the same (ValueError, ConnectionError, TimeoutError, ...).
#include <pybind11/numpy.h>

#include <array>
#include <string_view>
#include <utility>

#include "python/src/native.h"

namespace tierkv::python {
namespace {

constexpr std::array<std::pair<StatusCode, std::string_view>, 13> kCodeNames{{
    {StatusCode::kInvalidArgument, "INVALID_ARGUMENT"},
    {StatusCode::kNotFound, "NOT_FOUND"},
    {StatusCode::kAlreadyExists, "ALREADY_EXISTS"},
    {StatusCode::kResourceExhausted, "RESOURCE_EXHAUSTED"},
    {StatusCode::kFailedPrecondition, "FAILED_PRECONDITION"},
    {StatusCode::kOutOfRange, "OUT_OF_RANGE"},
    {StatusCode::kPermissionDenied, "PERMISSION_DENIED"},
    {StatusCode::kUnavailable, "UNAVAILABLE"},
    {StatusCode::kDataLoss, "DATA_LOSS"},
    {StatusCode::kUnimplemented, "UNIMPLEMENTED"},
    {StatusCode::kInternal, "INTERNAL"},
    {StatusCode::kDeadlineExceeded, "DEADLINE_EXCEEDED"},
    {StatusCode::kAborted, "ABORTED"},
}};

std::string_view CodeName(StatusCode code) {
  for (const auto& [c, name] : kCodeNames) {
    if (c == code) return name;
  }
  return "INTERNAL";
}

StatusCode CodeFromName(std::string_view name) {
  for (const auto& [c, n] : kCodeNames) {
    if (n == name) return c;
  }
  return StatusCode::kInternal;
}

// Set once by InitErrors; never released (they live as long as the module).
py::handle error_for;
py::handle error_class;

}  // namespace

void InitErrors() {
  const py::module_ errors = py::module_::import("tierkv._errors");
  error_for = py::object(errors.attr("error_for")).release();
  error_class = py::object(errors.attr("Error")).release();
  // py::array's numpy API, which token and tensor arguments use.
  py::detail::npy_api::get();
}

py::object ErrorObject(const Status& status) {
  return error_for(CodeName(status.code()), status.message());
}

py::object ErrorOrNone(const Status& status) {
  if (status.ok()) return py::none();
  return ErrorObject(status);
}

void Raise(const Status& status) {
  py::object error = ErrorObject(status);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())),
                  error.ptr());
  throw py::error_already_set();
}

Status StatusFromObject(const py::handle& error) {
  if (error.is_none()) return Status::Ok();
  if (py::isinstance(error, error_class)) {
    return Status(CodeFromName(py::str(error.attr("code")).cast<std::string>()),
                  py::str(error.attr("message")).cast<std::string>());
  }
  // A flag or a number (numpy's and torch's too) says nothing of why a
  // copy failed, and False or 0 reads as "no error": refused rather than
  // taken as a failure.
  if (PyNumber_Check(error.ptr()) != 0 && !py::isinstance<py::str>(error)) {
    throw py::type_error(
        "error is " + py::repr(error).cast<std::string>() +
        ": None for a copy that succeeded, else a message or a tierkv.Error");
  }
  if (py::isinstance<py::str>(error)) {
    // A bare message: the engine's copy failed for that reason.
    std::string message = error.cast<std::string>();
    if (message.empty()) {
      throw py::value_error(
          "error is an empty message: None for a copy that succeeded, else "
          "why it failed");
    }
    return Status::Internal(std::move(message));
  }
  return Status::Internal(py::repr(error).cast<std::string>());
}

}  // namespace tierkv::python
