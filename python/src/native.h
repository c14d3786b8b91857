// Declarations shared by the sources of tierkv._native, the pybind11
// extension behind the `tierkv` Python package (python/tierkv/). Each
// Register* function adds its classes to the module; errors cross into
// Python as the exception classes of tierkv._errors.
// Every function here needs the GIL unless it says otherwise.
#ifndef TIERKV_PYTHON_SRC_NATIVE_H_
#define TIERKV_PYTHON_SRC_NATIVE_H_

#include <pybind11/pybind11.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tierkv/client.h"
#include "tierkv/device_tier.h"
#include "tierkv/status.h"

namespace tierkv::python {

namespace py = pybind11;

// Imports tierkv._errors (tierkv/__init__.py has imported it already) and
// numpy's C API, once, from the module's init: a first use from two threads
// at once would import them inside a function-local static, where a thread
// that gives up the GIL deadlocks the other.
void InitErrors();
// The tierkv.Error subclass instance for a non-OK `status`.
py::object ErrorObject(const Status& status);
// None for OK, else ErrorObject(status).
py::object ErrorOrNone(const Status& status);
// Raises ErrorObject(status) as a Python exception (py::error_already_set).
[[noreturn]] void Raise(const Status& status);
inline void ThrowIfError(const Status& status) {
  if (!status.ok()) Raise(status);
}
template <typename T>
T ValueOrRaise(StatusOr<T> s) {
  if (!s.ok()) Raise(s.status());
  return std::move(s).value();
}
// The Status a Python object stands for: None is OK; a tierkv.Error keeps
// its code and message; any other exception is Internal with its text.
Status StatusFromObject(const py::handle& error);

// Engine-owned memory registered as a device tier (tierkv.RegisteredDevice):
// the tier and the arrays or tensors it points into, which it keeps alive.
// Shared by every client that uses it, so the memory outlives them all.
struct RegisteredDevice {
  // Declared before `tier`, so destroyed after it: the tier's destructor
  // drains its queued copies, which still touch the tensors.
  std::vector<py::object> owners;  // The tensors the tier points into.
  std::unique_ptr<RegisteredDeviceTier> tier;
  int32_t rank = 0;
  int32_t num_ranks = 1;
  // Set while an open client copies through this device: each client has
  // its own copy engine, and two of them on one device would take each
  // other's finished copies. Guarded by the GIL.
  bool in_use = false;
};

// One client and what it must outlive. Shared by tierkv.Client and the
// host_block() views it handed out, so a view never points into a detached
// store's memory: the last of them to go closes the client (and reconnect()
// is refused while a view is alive).
struct ClientHandle {
  // Serializes the calls of Python threads (Client is not thread-safe).
  std::mutex mu;
  std::shared_ptr<RegisteredDevice> device;  // Null: the client owns one.
  // Null once detached (Detach): a call then finds the client closed.
  std::unique_ptr<Client> client;
  // host_block() views alive, and those being made (their bytes taken
  // under `mu`, their view not yet built): reconnect() would unmap the
  // memory they point into, so it is refused while either is non-zero.
  // reconnect() reads them under `mu`, where host_block() counts a view
  // being made, so the two are never interleaved.
  std::atomic<int> live_views{0};
  std::atomic<int> views_being_made{0};
  // Detaches now unless host_block() views are alive (they keep the
  // attachment): waits without the GIL for a call another thread runs on
  // the client and for the copies in flight, then lets `device` (and the
  // tensors it holds) go with the GIL held, so another client may use it.
  // Returns whether it detached. REQUIRES: the GIL.
  bool Detach();
  // Detach, views or not (none is left). REQUIRES: the GIL.
  ~ClientHandle();
};

// The ClientHandle of an open tierkv.Client; FailedPreconditionError for a
// closed one. REQUIRES: the GIL.
std::shared_ptr<ClientHandle> HandleOf(const py::handle& client);

void RegisterTypes(py::module_& m);   // KvLayout, TransferEvent, results.
void RegisterDevice(py::module_& m);  // RegisteredDevice.
void RegisterClient(py::module_& m);  // Client.
void RegisterBench(py::module_& m);   // _bench_store_load.

}  // namespace tierkv::python

#endif  // TIERKV_PYTHON_SRC_NATIVE_H_
