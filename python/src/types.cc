// The plain values of the Python API: KvLayout, TransferEvent (picklable:
// the scheduler hands events to its rank workers inside engine metadata),
// FinishedTransfer and the results of Lookup, Allocate and Commit. They are
// the C++ structs themselves, so crossing the boundary copies no KV byte
// and converts nothing but a few integers.
#include <pybind11/stl.h>

#include <string>
#include <tuple>

#include "python/src/native.h"
#include "tierkv/client.h"
#include "tierkv/kv_layout.h"
#include "tierkv/transfer.h"

namespace tierkv::python {
namespace {

DType ParseDType(const std::string& name) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (DTypeName(d) == name) return d;
  }
  Raise(Status::InvalidArgument("dtype '" + name +
                                "' is not one of \"f32\", \"f16\", \"bf16\""));
}

KvLayout MakeLayout(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim,
                    int32_t block_size, const std::string& dtype) {
  KvLayout layout{.num_layers = num_layers,
                  .num_kv_heads = num_kv_heads,
                  .head_dim = head_dim,
                  .block_size = block_size,
                  .dtype = ParseDType(dtype)};
  ThrowIfError(layout.Validate());
  return layout;
}

EventKind ParseKind(const std::string& kind) {
  if (kind == "load") return EventKind::kLoad;
  if (kind == "store") return EventKind::kStore;
  Raise(Status::InvalidArgument("event kind '" + kind +
                                "' is neither \"load\" nor \"store\""));
}

std::string EventRepr(const TransferEvent& e) {
  return std::string("TransferEvent(kind='") + EventKindName(e.ref.kind) +
         "', id=" + std::to_string(e.ref.id) +
         ", request=" + std::to_string(e.request) + ", device_blocks=" +
         py::repr(py::cast(e.device_blocks)).cast<std::string>() +
         ", host_blocks=" +
         py::repr(py::cast(e.host_blocks)).cast<std::string>() +
         ", failed_blocks=" + std::to_string(e.failed_blocks) + ")";
}

bool EventsEqual(const TransferEvent& a, const TransferEvent& b) {
  return a.ref == b.ref && a.request == b.request &&
         a.device_blocks == b.device_blocks && a.host_blocks == b.host_blocks &&
         a.failed_blocks == b.failed_blocks;
}

using EventState =
    std::tuple<std::string, uint64_t, RequestId, std::vector<BlockId>,
               std::vector<BlockId>, int32_t>;

TransferEvent MakeEvent(const std::string& kind, uint64_t id, RequestId request,
                        std::vector<BlockId> device_blocks,
                        std::vector<BlockId> host_blocks,
                        int32_t failed_blocks) {
  if (device_blocks.size() != host_blocks.size()) {
    Raise(Status::InvalidArgument(
        "a TransferEvent needs as many host_blocks (" +
        std::to_string(host_blocks.size()) + ") as device_blocks (" +
        std::to_string(device_blocks.size()) + ")"));
  }
  return TransferEvent{.ref = {ParseKind(kind), id},
                       .request = request,
                       .device_blocks = std::move(device_blocks),
                       .host_blocks = std::move(host_blocks),
                       .failed_blocks = failed_blocks};
}

void RegisterLayout(py::module_& m) {
  py::class_<KvLayout>(m, "KvLayout",
                       "The shape of the KV cache a store serves; one block "
                       "holds K then V of every layer.")
      .def(py::init(&MakeLayout), py::arg("num_layers"),
           py::arg("num_kv_heads"), py::arg("head_dim"),
           py::arg("block_size") = 16, py::arg("dtype") = "bf16")
      .def_readonly("num_layers", &KvLayout::num_layers)
      .def_readonly("num_kv_heads", &KvLayout::num_kv_heads)
      .def_readonly("head_dim", &KvLayout::head_dim)
      .def_readonly("block_size", &KvLayout::block_size)
      .def_property_readonly(
          "dtype", [](const KvLayout& l) { return DTypeName(l.dtype); })
      .def_property_readonly("element_size", &KvLayout::ElementSize)
      .def_property_readonly("block_bytes", &KvLayout::BlockBytes)
      .def("__str__", &KvLayout::ToString)
      .def("__repr__",
           [](const KvLayout& l) {
             return "KvLayout(num_layers=" + std::to_string(l.num_layers) +
                    ", num_kv_heads=" + std::to_string(l.num_kv_heads) +
                    ", head_dim=" + std::to_string(l.head_dim) +
                    ", block_size=" + std::to_string(l.block_size) +
                    ", dtype='" + std::string(DTypeName(l.dtype)) + "')";
           })
      // is_operator: another type compares unequal (NotImplemented), not
      // TypeError.
      .def(
          "__eq__", [](const KvLayout& a, const KvLayout& b) { return a == b; },
          py::is_operator())
      .def("__hash__",
           [](const KvLayout& l) { return py::hash(py::str(l.Fingerprint())); })
      .def(py::pickle(
          [](const KvLayout& l) {
            return py::make_tuple(l.num_layers, l.num_kv_heads, l.head_dim,
                                  l.block_size, DTypeName(l.dtype));
          },
          [](const py::tuple& t) {
            return MakeLayout(t[0].cast<int32_t>(), t[1].cast<int32_t>(),
                              t[2].cast<int32_t>(), t[3].cast<int32_t>(),
                              t[4].cast<std::string>());
          }));
}

void RegisterEvents(py::module_& m) {
  py::class_<TransferEvent>(
      m, "TransferEvent",
      "A copy between device blocks and host slots: device_blocks[i] <-> "
      "host_blocks[i]. Plain data, picklable.")
      .def(py::init(&MakeEvent), py::arg("kind"), py::arg("id"),
           py::arg("request"), py::arg("device_blocks"), py::arg("host_blocks"),
           py::arg("failed_blocks") = 0)
      .def_property_readonly(
          "kind",
          [](const TransferEvent& e) { return EventKindName(e.ref.kind); })
      .def_property_readonly("id",
                             [](const TransferEvent& e) { return e.ref.id; })
      .def_readonly("request", &TransferEvent::request)
      .def_readonly("device_blocks", &TransferEvent::device_blocks)
      .def_readonly("host_blocks", &TransferEvent::host_blocks)
      .def_readonly("failed_blocks", &TransferEvent::failed_blocks)
      .def("__repr__", &EventRepr)
      .def("__eq__", &EventsEqual, py::is_operator())
      .def("__hash__",
           [](const TransferEvent& e) {
             return py::hash(py::make_tuple(static_cast<int>(e.ref.kind),
                                            e.ref.id, e.request));
           })
      .def(py::pickle(
          [](const TransferEvent& e) {
            return EventState(EventKindName(e.ref.kind), e.ref.id, e.request,
                              e.device_blocks, e.host_blocks, e.failed_blocks);
          },
          [](const EventState& s) { return std::apply(MakeEvent, s); }));

  py::class_<FinishedTransfer>(
      m, "FinishedTransfer",
      "A transfer whose copy finished or failed; hand it to "
      "Client.complete. In caller mode the engine builds it: "
      "FinishedTransfer(event, error=None, session=client.session).")
      .def(py::init([](TransferEvent event, const py::object& error,
                       uint64_t session) {
             return FinishedTransfer{.event = std::move(event),
                                     .status = StatusFromObject(error),
                                     .session = session};
           }),
           py::arg("event"), py::arg("error") = py::none(),
           py::arg("session") = 0)
      .def_readonly("event", &FinishedTransfer::event)
      .def_property_readonly(
          "ok", [](const FinishedTransfer& f) { return f.status.ok(); })
      .def_property_readonly(
          "error",
          [](const FinishedTransfer& f) { return ErrorOrNone(f.status); })
      .def_readonly("session", &FinishedTransfer::session)
      .def_property_readonly("loaded_blocks", &FinishedTransfer::loaded_blocks)
      .def("__repr__",
           [](const FinishedTransfer& f) {
             return "FinishedTransfer(" + EventRepr(f.event) + ", " +
                    (f.status.ok() ? std::string("ok") : f.status.ToString()) +
                    ", session=" + std::to_string(f.session) + ")";
           })
      .def(py::pickle(
          [](const FinishedTransfer& f) {
            return py::make_tuple(f.event, ErrorOrNone(f.status), f.session);
          },
          [](const py::tuple& t) {
            return FinishedTransfer{.event = t[0].cast<TransferEvent>(),
                                    .status = StatusFromObject(t[1]),
                                    .session = t[2].cast<uint64_t>()};
          }));
}

void RegisterResults(py::module_& m) {
  py::class_<LookupResult>(m, "LookupResult")
      .def_readonly("hit_tokens", &LookupResult::hit_tokens)
      .def_readonly("disk_hit_tokens", &LookupResult::disk_hit_tokens)
      .def("__repr__", [](const LookupResult& r) {
        return "LookupResult(hit_tokens=" + std::to_string(r.hit_tokens) +
               ", disk_hit_tokens=" + std::to_string(r.disk_hit_tokens) + ")";
      });
  py::class_<AllocateResult>(m, "AllocateResult")
      .def_readonly("load", &AllocateResult::load)
      .def_readonly("load_pending", &AllocateResult::load_pending)
      .def_property_readonly("store_status", [](const AllocateResult& r) {
        return ErrorOrNone(r.store_status);
      });
  py::class_<CommitResult>(m, "CommitResult")
      .def_readonly("stores", &CommitResult::stores)
      .def_readonly("skipped_blocks", &CommitResult::skipped_blocks)
      .def_property_readonly("store_status", [](const CommitResult& r) {
        return ErrorOrNone(r.store_status);
      });
}

}  // namespace

void RegisterTypes(py::module_& m) {
  RegisterLayout(m);
  RegisterEvents(m);
  RegisterResults(m);
}

}  // namespace tierkv::python
