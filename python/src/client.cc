// tierkv.Client: the C++ Client behind a Python object. Each call converts
// its arguments with the GIL held, then runs without it (tierkvd round
// trips, waits and copies never hold up other Python threads) under the
// handle's mutex, then converts the result back with the GIL.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "python/src/native.h"
#include "tierkv/block_key.h"
#include "tierkv/embedded.h"
#include "tierkv/stats.h"

namespace tierkv::python {

bool ClientHandle::Detach() {
  if (live_views > 0) return false;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu);
    // Counted before its bytes are taken, under `mu`: none is in the making
    // unless this sees it.
    if (live_views + views_being_made > 0) return false;
    client.reset();
  }
  if (device != nullptr) device->in_use = false;
  device.reset();
  return true;
}

ClientHandle::~ClientHandle() {
  {
    py::gil_scoped_release release;
    client.reset();
  }
  if (device != nullptr) device->in_use = false;
}

namespace {

class PyClient {
 public:
  explicit PyClient(std::shared_ptr<ClientHandle> handle)
      : handle_(std::move(handle)) {}
  PyClient(PyClient&&) = default;
  PyClient& operator=(PyClient&&) = default;
  ~PyClient() { Close(); }

  std::shared_ptr<ClientHandle> Handle() const {
    if (handle_ == nullptr) {
      Raise(Status::FailedPrecondition(
          "this tierkv.Client is closed; open a new one"));
    }
    return handle_;
  }

  // Runs f(Client&) without the GIL, alone on this client.
  template <typename F>
  auto Call(F&& f) const {
    std::shared_ptr<ClientHandle> h = Handle();
    try {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(h->mu);
      if (h->client == nullptr) throw ClosedMeanwhile{};
      return f(*h->client);
    } catch (const ClosedMeanwhile&) {
      // Raised with the GIL held again.
      Raise(Status::FailedPrecondition(
          "this tierkv.Client was closed by another thread during the call"));
    }
  }

  // A wait of up to `timeout` as slices of at most kWaitSlice, each alone
  // on the client (other threads' calls go between them) and each followed
  // by a check for signals with the GIL held, so that Ctrl-C interrupts a
  // long wait. `wait(client, slice)` returns whether the wait is over.
  template <typename F>
  void SlicedWait(std::chrono::milliseconds timeout, F&& wait) const {
    static constexpr std::chrono::milliseconds kWaitSlice{100};
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      const bool last = left <= kWaitSlice;
      const std::chrono::milliseconds slice =
          last ? std::max(left, std::chrono::milliseconds(0)) : kWaitSlice;
      if (Call([&](Client& client) { return wait(client, slice, last); })) {
        return;
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }

  bool closed() const { return handle_ == nullptr; }

  // Detaches once a call another thread runs on the client ends (a long
  // wait ends at its next slice); that thread's later calls find the client
  // closed. Host slot views keep the attachment until they are released.
  void Close() {
    std::shared_ptr<ClientHandle> h = std::move(handle_);
    if (h != nullptr && h.use_count() > 1) (void)h->Detach();
  }

 private:
  // A call that found the client detached by another thread's Close.
  struct ClosedMeanwhile {};

  std::shared_ptr<ClientHandle> handle_;
};

// A host slot's bytes, exported through the buffer protocol; the
// memoryview over it keeps it, and so the client's handle, alive. Counted
// in the handle's live_views while it exists. Created and destroyed with
// the GIL held.
class HostSlot {
 public:
  HostSlot(std::shared_ptr<ClientHandle> handle, std::span<std::byte> bytes)
      : handle_(std::move(handle)), bytes_(bytes) {
    ++handle_->live_views;
  }
  HostSlot(const HostSlot& other) : HostSlot(other.handle_, other.bytes_) {}
  HostSlot& operator=(const HostSlot&) = delete;
  ~HostSlot() { --handle_->live_views; }

  std::span<std::byte> bytes() const { return bytes_; }

 private:
  std::shared_ptr<ClientHandle> handle_;
  std::span<std::byte> bytes_;
};

CopyMode ParseCopyMode(const std::string& name) {
  for (CopyMode m : {CopyMode::kClient, CopyMode::kCaller, CopyMode::kRanks}) {
    if (name == CopyModeName(m)) return m;
  }
  Raise(Status::InvalidArgument(
      "copies='" + name + "' is not \"client\", \"caller\" or \"ranks\""));
}

std::chrono::milliseconds Millis(double seconds, const char* what) {
  if (!(seconds >= 0) || seconds > 1e9) {
    Raise(Status::InvalidArgument(std::string(what) +
                                  " must be seconds >= 0, not " +
                                  std::to_string(seconds)));
  }
  return std::chrono::milliseconds(
      static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

std::vector<TokenId> Tokens(const py::handle& tokens) {
  // Integers only: a forced cast would truncate floats (1.9 -> 1), keys of
  // other tokens. An empty sequence is float64 to numpy, and no tokens.
  const py::array given = py::array::ensure(tokens);
  if (given && given.size() > 0 && given.dtype().kind() != 'i' &&
      given.dtype().kind() != 'u') {
    Raise(Status::InvalidArgument(
        "tokens must be integers, not an array of dtype " +
        std::string(py::str(given.dtype()))));
  }
  if (given && given.size() > 0 && given.dtype().kind() == 'u') {
    // Unsigned: checked as such, so 2**63 is not read as a negative id.
    const auto u =
        py::array_t<uint64_t,
                    py::array::c_style | py::array::forcecast>::ensure(given);
    if (u && u.ndim() == 1) {
      for (py::ssize_t i = 0; i < u.size(); ++i) {
        if (u.data()[i] > std::numeric_limits<TokenId>::max()) {
          Raise(Status::InvalidArgument("token " + std::to_string(u.data()[i]) +
                                        " at index " + std::to_string(i) +
                                        " is not a uint32 token id"));
        }
      }
    }
  }
  auto array =
      py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(
          given ? py::handle(given) : tokens);
  if (!array || array.ndim() != 1) {
    Raise(Status::InvalidArgument(
        "tokens must be a sequence of ints or a 1-D integer array"));
  }
  std::vector<TokenId> out(static_cast<size_t>(array.size()));
  const int64_t* data = array.data();
  for (size_t i = 0; i < out.size(); ++i) {
    if (data[i] < 0 || data[i] > std::numeric_limits<TokenId>::max()) {
      Raise(Status::InvalidArgument("token " + std::to_string(data[i]) +
                                    " at index " + std::to_string(i) +
                                    " is not a uint32 token id"));
    }
    out[i] = static_cast<TokenId>(data[i]);
  }
  return out;
}

// The options shared by open and open_embedded.
struct OpenArgs {
  KvLayout layout;
  std::optional<int32_t> num_device_blocks;
  std::string model, tenant, name;
  std::shared_ptr<RegisteredDevice> device;
  std::string copies = "client";
  int32_t ranks = 0;
  WorkerId scheduler = 0;
  int32_t rank = 0;
  double call_timeout = 5.0;
  std::optional<uid_t> daemon_uid;
  std::string attachment_tag = {};
};

ClientOptions OptionsFor(const OpenArgs& a) {
  ClientOptions o;
  o.layout = a.layout;
  o.model = a.model;
  o.tenant = a.tenant;
  o.name = a.name;
  o.copies = ParseCopyMode(a.copies);
  o.ranks = a.ranks;
  o.scheduler = a.scheduler;
  o.rank = a.rank;
  o.attachment_tag = a.attachment_tag;
  o.call_timeout = Millis(a.call_timeout, "call_timeout");
  o.daemon_uid = a.daemon_uid;
  if (a.device != nullptr) {
    // Same bytes per block is not the same layout (f16 and bf16, layers
    // and block size traded): bytes stored under the wrong layout are
    // wrong KV for every worker that loads them.
    const KvLayout& registered = a.device->tier->options().layout;
    if (!(registered == a.layout)) {
      Raise(Status::InvalidArgument(
          "the device was registered with layout " + registered.ToString() +
          ", the client opens " + a.layout.ToString()));
    }
    // A shard's stores write only its heads: a whole block takes every
    // rank's, which only a scheduler's rank clients together copy.
    if (a.device->num_ranks > 1 && a.scheduler == 0) {
      Raise(Status::InvalidArgument(
          "the device holds rank " + std::to_string(a.device->rank) +
          "'s shard of " + std::to_string(a.device->num_ranks) +
          " of the heads: open it as a rank client (scheduler=, rank=)"));
    }
    if (a.scheduler != 0 && a.device->rank != a.rank) {
      Raise(Status::InvalidArgument(
          "rank=" + std::to_string(a.rank) + " but the device holds rank " +
          std::to_string(a.device->rank) + "'s shard of the heads"));
    }
    o.device = a.device->tier.get();
    o.num_device_blocks =
        a.num_device_blocks.value_or(a.device->tier->num_blocks());
  } else if (a.num_device_blocks.has_value()) {
    o.num_device_blocks = *a.num_device_blocks;
  } else if (o.copies == CopyMode::kClient && a.scheduler == 0) {
    Raise(Status::InvalidArgument(
        "num_device_blocks is required without a device (it sizes the "
        "emulated device)"));
  }
  return o;
}

// Marks `device` used by the client being opened, until Release() (the
// open failed) or the ClientHandle that takes it over is destroyed.
class DeviceClaim {
 public:
  explicit DeviceClaim(std::shared_ptr<RegisteredDevice> device)
      : device_(std::move(device)) {
    if (device_ == nullptr) return;
    if (device_->in_use) {
      Raise(Status::AlreadyExists(
          "this RegisteredDevice already backs an open tierkv.Client; close "
          "that client first (each client copies through its device on its "
          "own, and two would take each other's finished copies), or "
          "register the memory for one client only"));
    }
    device_->in_use = true;
  }
  DeviceClaim(const DeviceClaim&) = delete;
  DeviceClaim& operator=(const DeviceClaim&) = delete;
  ~DeviceClaim() {
    if (device_ != nullptr) device_->in_use = false;
  }

  // Hands the claim to a ClientHandle, whose destructor ends it.
  std::shared_ptr<RegisteredDevice> Take() { return std::move(device_); }

 private:
  std::shared_ptr<RegisteredDevice> device_;
};

py::object Wrap(StatusOr<std::unique_ptr<Client>> client, DeviceClaim& claim) {
  std::unique_ptr<Client> c = ValueOrRaise(std::move(client));
  auto handle = std::make_shared<ClientHandle>();
  handle->client = std::move(c);
  handle->device = claim.Take();
  return py::cast(PyClient(std::move(handle)));
}

py::object Open(const std::string& socket_path, const OpenArgs& args) {
  if (socket_path.empty()) {
    Raise(Status::InvalidArgument(
        "socket_path is empty; use Client.open_embedded for a store in this "
        "process"));
  }
  ClientOptions options = OptionsFor(args);
  options.socket_path = socket_path;
  DeviceClaim claim(args.device);
  StatusOr<std::unique_ptr<Client>> client = [&] {
    py::gil_scoped_release release;
    return Client::Open(options);
  }();
  return Wrap(std::move(client), claim);
}

py::object OpenInProcess(const OpenArgs& args,
                         const EmbeddedOptions& embedded) {
  ClientOptions options = OptionsFor(args);
  DeviceClaim claim(args.device);
  StatusOr<std::unique_ptr<Client>> client = [&] {
    py::gil_scoped_release release;
    return OpenEmbedded(options, embedded);
  }();
  return Wrap(std::move(client), claim);
}

// A stats struct with a field table as a dict, in table order.
template <typename S>
py::dict FieldsDict(const S& stats) {
  py::dict d;
  S::ForEachField(stats, [&](const StatField& field, const auto& value) {
    d[field.name] = py::cast(value);
  });
  return d;
}

py::dict LatencyDict(const EventLatency& l) {
  py::dict d;
  d["buckets"] = py::cast(
      std::vector<uint64_t>(std::begin(l.buckets), std::end(l.buckets)));
  d["bucket_bounds_us"] =
      py::cast(std::vector<uint64_t>(std::begin(EventLatency::kBucketMicros),
                                     std::end(EventLatency::kBucketMicros)));
  d["count"] = l.count;
  d["sum_us"] = l.sum_us;
  return d;
}

py::dict StatsDict(const CoordinatorStats& s) {
  py::dict d;
  d["host"] = FieldsDict(s.host);
  d["load_latency"] = LatencyDict(s.load_latency);
  d["store_latency"] = LatencyDict(s.store_latency);
  d["spill_latency"] = LatencyDict(s.spill_latency);
  d["promotion_latency"] = LatencyDict(s.promotion_latency);
  d["oldest_event_age_us"] = s.oldest_event_age_us;
  d["disk"] = s.disk.has_value() ? py::object(FieldsDict(*s.disk)) : py::none();
  d["remote"] =
      s.remote.has_value() ? py::object(FieldsDict(*s.remote)) : py::none();
  d["attach"] = FieldsDict(s.attach);
  d["model"] = s.model;
  d["store"] = s.store;
  d["key_fingerprint"] = s.key_fingerprint;
  d["block_size"] = s.block_size;
  d["version"] = s.version;
  py::list workers;
  for (const WorkerStats& w : s.workers) workers.append(FieldsDict(w));
  d["workers"] = workers;
  return d;
}

// A request's multimodal inputs, from (identifier, offset, length) tuples:
// the engine's content identifier of each item (str or bytes; vLLM's
// mm_features[i].identifier) and the placeholder tokens it occupies. None:
// no items.
std::vector<MultiModalItem> MultiModalItems(const py::handle& items) {
  std::vector<MultiModalItem> out;
  if (items.is_none()) return out;
  size_t index = 0;
  for (const py::handle& item : items) {
    const std::string which = "mm_items[" + std::to_string(index++) + "] " +
                              py::repr(item).cast<std::string>();
    if (py::isinstance<py::str>(item) || py::isinstance<py::bytes>(item)) {
      throw py::type_error(which +
                           ": each item is an (identifier, offset, length) "
                           "tuple, not a string");
    }
    // Any sequence (a tuple, a list); not one: TypeError.
    const py::tuple t(py::reinterpret_borrow<py::object>(item));
    if (t.size() != 3) {
      throw py::value_error(which +
                            ": each item is (identifier, offset, length)");
    }
    std::string id;
    int64_t start = 0, length = 0;
    try {
      id = py::isinstance<py::bytes>(t[0]) ? std::string(t[0].cast<py::bytes>())
                                           : t[0].cast<std::string>();
      if (!py::isinstance<py::int_>(t[1]) || !py::isinstance<py::int_>(t[2])) {
        throw py::cast_error();
      }
      start = t[1].cast<int64_t>();
      length = t[2].cast<int64_t>();
    } catch (const py::cast_error&) {
      throw py::type_error(which +
                           ": the identifier is a str or bytes, the offset "
                           "and length are ints that fit 64 bits");
    }
    if (id.empty() || start < 0 || length < 1) {
      throw py::value_error(which +
                            ": an item needs an identifier, an offset >= 0 "
                            "and a length >= 1");
    }
    out.push_back({.hash = ContentKey(id), .start = start, .length = length});
  }
  return out;
}

template <typename F>
py::object Property(const PyClient& c, F&& f) {
  return py::cast(c.Call(std::forward<F>(f)));
}

void RegisterMethods(py::class_<PyClient>& cls) {
  cls.def(
         "lookup",
         [](const PyClient& c, RequestId request, const py::handle& tokens,
            int32_t num_computed_tokens, std::optional<uint64_t> lora_id,
            std::string cache_salt, const py::handle& mm_items) {
           std::vector<TokenId> t = Tokens(tokens);
           RequestExtras extras{.lora_id = lora_id,
                                .mm_items = MultiModalItems(mm_items),
                                .cache_salt = std::move(cache_salt)};
           return ValueOrRaise(c.Call([&](Client& client) {
             return client.Lookup(request, t, num_computed_tokens, extras);
           }));
         },
         py::arg("request_id"), py::arg("tokens"),
         py::arg("num_computed_tokens") = 0, py::kw_only(),
         py::arg("lora_id") = py::none(), py::arg("cache_salt") = "",
         py::arg("mm_items") = py::none())
      .def(
          "lookup_chunk",
          [](const PyClient& c, RequestId request, const py::handle& tokens,
             int64_t virtual_start, const std::string& rope_config,
             const std::string& variant) {
            std::vector<TokenId> t = Tokens(tokens);
            // Neither named: the keys of chunks stored with no variant.
            const BlockKey v = rope_config.empty() && variant.empty()
                                   ? BlockKey{}
                                   : ChunkVariant(rope_config, variant);
            return ValueOrRaise(c.Call([&](Client& client) {
              return client.LookupChunk(request, t, virtual_start, v);
            }));
          },
          py::arg("request_id"), py::arg("tokens"),
          py::arg("virtual_start") = 0, py::kw_only(),
          py::arg("rope_config") = "", py::arg("variant") = "",
          "Looks a position-independent chunk up by its content, the "
          "virtual position its KV is computed at, and its variant: "
          "rope_config (text naming the RoPE its K was rotated with; to "
          "share a C++ ChunkKvStore's chunks, exactly the text of that "
          "store's RopeConfig::ToString(): other text is another variant, a "
          "miss) and variant (what else changes the KV: an adapter, a "
          "salt). Allocate and commit store it under the same "
          "keys. KV keyed under one variant is never served to another; "
          "with neither named, the chunk's keys carry no variant.")
      .def(
          "allocate",
          [](const PyClient& c, RequestId request,
             const std::vector<BlockId>& device_blocks,
             int32_t num_external_tokens) {
            return ValueOrRaise(c.Call([&](Client& client) {
              return client.Allocate(request, device_blocks,
                                     num_external_tokens);
            }));
          },
          py::arg("request_id"), py::arg("device_blocks"),
          py::arg("num_external_tokens"))
      .def(
          "commit",
          [](const PyClient& c, RequestId request, int32_t num_computed_tokens,
             const std::vector<BlockId>& device_blocks) {
            return ValueOrRaise(c.Call([&](Client& client) {
              return client.Commit(request, num_computed_tokens, device_blocks);
            }));
          },
          py::arg("request_id"), py::arg("num_computed_tokens"),
          py::arg("device_blocks"))
      .def("take_ready_loads",
           [](const PyClient& c) {
             return ValueOrRaise(c.Call(
                 [](Client& client) { return client.TakeReadyLoads(); }));
           })
      .def(
          "start",
          [](const PyClient& c, const TransferEvent& event) {
            ThrowIfError(
                c.Call([&](Client& client) { return client.Start(event); }));
          },
          py::arg("event"))
      .def(
          "decline",
          [](const PyClient& c, const std::vector<TransferEvent>& events) {
            ThrowIfError(
                c.Call([&](Client& client) { return client.Decline(events); }));
          },
          py::arg("events"))
      .def("poll_events",
           [](const PyClient& c) {
             return c.Call([](Client& client) { return client.PollEvents(); });
           })
      .def(
          "wait_events",
          [](const PyClient& c, double timeout) {
            const std::chrono::milliseconds ms = Millis(timeout, "timeout");
            std::vector<FinishedTransfer> done;
            c.SlicedWait(ms, [&](Client& client,
                                 std::chrono::milliseconds slice, bool last) {
              done = client.WaitEvents(slice);
              // Without a device (caller or ranks copy) it never waits:
              // sliced, it would spin for the whole timeout.
              return last || !done.empty() || client.device() == nullptr;
            });
            return done;
          },
          py::arg("timeout"))
      .def(
          "complete",
          [](const PyClient& c, std::vector<FinishedTransfer> finished) {
            ThrowIfError(c.Call([&](Client& client) {
              // Session 0 (the engine built it without one): this attachment.
              for (FinishedTransfer& f : finished) {
                if (f.session == 0) f.session = client.session();
              }
              return client.Complete(finished);
            }));
          },
          py::arg("finished"))
      .def(
          "finish",
          [](const PyClient& c, RequestId request) {
            ThrowIfError(
                c.Call([&](Client& client) { return client.Finish(request); }));
          },
          py::arg("request_id"))
      .def("stats",
           [](const PyClient& c) {
             return StatsDict(ValueOrRaise(
                 c.Call([](Client& client) { return client.Stats(); })));
           })
      .def(
          "wait_idle",
          [](const PyClient& c, double timeout) {
            const std::chrono::milliseconds ms = Millis(timeout, "timeout");
            Status idle;
            bool connected = true;
            c.SlicedWait(ms, [&](Client& client,
                                 std::chrono::milliseconds slice, bool last) {
              idle = client.WaitIdle(slice);
              // A call that timed out (tierkvd stopped answering) ends the
              // wait as it is: the client is no longer connected.
              connected = client.connected();
              return last || idle.code() != StatusCode::kDeadlineExceeded ||
                     !connected;
            });
            if (idle.code() == StatusCode::kDeadlineExceeded && connected) {
              idle = Status::DeadlineExceeded(
                  "the store's disk tier was still busy after " +
                  std::to_string(ms.count()) + " ms");
            }
            ThrowIfError(idle);
          },
          py::arg("timeout"))
      .def("reconnect",
           [](const PyClient& c) {
             // Attaching anew maps a new host segment and unmaps the old
             // one, which the views point into. Checked under the call's
             // mutex: a host_block() on another thread counts its view
             // there before it takes the bytes.
             std::shared_ptr<ClientHandle> h = c.Handle();
             ThrowIfError(c.Call([&h](Client& client) {
               const int views = h->live_views + h->views_being_made;
               if (views > 0) {
                 return Status::FailedPrecondition(
                     std::to_string(views) +
                     " host_block() view(s) of this client are alive; "
                     "reconnecting would unmap the memory they point into: "
                     "drop them (del view, or view.release()) first");
               }
               return client.Reconnect();
             }));
           })
      .def(
          "host_block",
          [](const PyClient& c, BlockId slot) {
            std::shared_ptr<ClientHandle> h = c.Handle();
            std::span<std::byte> bytes =
                ValueOrRaise(c.Call([&](Client& client) {
                  StatusOr<std::span<std::byte>> got = client.host_block(slot);
                  if (got.ok()) ++h->views_being_made;  // Under the mutex.
                  return got;
                }));
            // The view is counted (live_views) before it stops being made.
            HostSlot slot_bytes(h, bytes);
            --h->views_being_made;
            py::object owner = py::cast(std::move(slot_bytes));
            return py::reinterpret_steal<py::memoryview>(
                PyMemoryView_FromObject(owner.ptr()));
          },
          py::arg("slot"));
}

void RegisterProperties(py::class_<PyClient>& cls) {
  cls.def_property_readonly("worker_id",
                            [](const PyClient& c) {
                              return Property(
                                  c, [](Client& x) { return x.worker_id(); });
                            })
      .def_property_readonly("session",
                             [](const PyClient& c) {
                               return Property(
                                   c, [](Client& x) { return x.session(); });
                             })
      .def_property_readonly("connected",
                             [](const PyClient& c) {
                               return Property(
                                   c, [](Client& x) { return x.connected(); });
                             })
      .def_property_readonly("connection_error",
                             [](const PyClient& c) {
                               return ErrorOrNone(c.Call([](Client& x) {
                                 return x.connection_status();
                               }));
                             })
      .def_property_readonly("embedded",
                             [](const PyClient& c) {
                               return Property(
                                   c, [](Client& x) { return x.embedded(); });
                             })
      .def_property_readonly("copies",
                             [](const PyClient& c) {
                               return Property(c, [](Client& x) {
                                 return std::string(CopyModeName(x.copies()));
                               });
                             })
      .def_property_readonly("layout",
                             [](const PyClient& c) {
                               return Property(
                                   c, [](Client& x) { return x.layout(); });
                             })
      .def_property_readonly("transfers_in_flight",
                             [](const PyClient& c) {
                               return Property(c, [](Client& x) {
                                 return x.transfers_in_flight();
                               });
                             })
      .def_property_readonly(
          "loads_pending",
          [](const PyClient& c) {
            return Property(c, [](Client& x) { return x.loads_pending(); });
          })
      .def_property_readonly(
          "device",
          [](const PyClient& c) { return py::cast(c.Handle()->device); })
      .def_property_readonly("closed", &PyClient::closed);
}

}  // namespace

std::shared_ptr<ClientHandle> HandleOf(const py::handle& client) {
  return client.cast<const PyClient&>().Handle();
}

void RegisterClient(py::module_& m) {
  py::class_<HostSlot>(m, "_HostSlot", py::buffer_protocol())
      .def_buffer([](HostSlot& s) {
        return py::buffer_info(
            s.bytes().data(), 1, py::format_descriptor<uint8_t>::format(), 1,
            {static_cast<py::ssize_t>(s.bytes().size())}, {1},
            /*readonly=*/false);
      });

  py::class_<PyClient> cls(
      m, "Client",
      "A worker's client of a tierkv store: attached to a tierkvd "
      "(Client.open) or embedded (Client.open_embedded). Calls from several "
      "threads are serialized; every blocking call releases the GIL.");
  cls.def_static(
         "open",
         [](const std::string& socket_path, const KvLayout& layout,
            std::optional<int32_t> num_device_blocks, std::string model,
            std::string tenant, std::string name,
            std::shared_ptr<RegisteredDevice> device, std::string copies,
            int32_t ranks, WorkerId scheduler, int32_t rank,
            double call_timeout, std::optional<uid_t> daemon_uid,
            std::string attachment_tag) {
           return Open(
               socket_path,
               OpenArgs{layout, num_device_blocks, std::move(model),
                        std::move(tenant), std::move(name), std::move(device),
                        std::move(copies), ranks, scheduler, rank, call_timeout,
                        daemon_uid, std::move(attachment_tag)});
         },
         py::arg("socket_path"), py::arg("layout"),
         py::arg("num_device_blocks") = py::none(), py::kw_only(),
         py::arg("model") = "", py::arg("tenant") = "", py::arg("name") = "",
         py::arg("device") = py::none(), py::arg("copies") = "client",
         py::arg("ranks") = 0, py::arg("scheduler") = 0, py::arg("rank") = 0,
         py::arg("call_timeout") = 5.0, py::arg("daemon_uid") = py::none(),
         py::arg("attachment_tag") = "",
         "Attaches to the tierkvd serving socket_path.")
      .def_static(
          "open_embedded",
          [](const KvLayout& layout, std::optional<int32_t> num_device_blocks,
             size_t host_bytes, std::optional<std::string> disk_path,
             uint64_t disk_bytes, std::string model, std::string tenant,
             std::string name, std::shared_ptr<RegisteredDevice> device,
             std::string copies, int32_t ranks, WorkerId scheduler,
             int32_t rank, double call_timeout) {
            return OpenInProcess(
                OpenArgs{layout, num_device_blocks, std::move(model),
                         std::move(tenant), std::move(name), std::move(device),
                         std::move(copies), ranks, scheduler, rank,
                         call_timeout, std::nullopt},
                EmbeddedOptions{.host_bytes = host_bytes,
                                .disk_path = disk_path.value_or(""),
                                .disk_bytes = disk_bytes});
          },
          py::arg("layout"), py::arg("num_device_blocks") = py::none(),
          py::kw_only(), py::arg("host_bytes") = size_t{256} << 20,
          py::arg("disk_path") = py::none(),
          py::arg("disk_bytes") = uint64_t{4} << 30, py::arg("model") = "",
          py::arg("tenant") = "", py::arg("name") = "",
          py::arg("device") = py::none(), py::arg("copies") = "client",
          py::arg("ranks") = 0, py::arg("scheduler") = 0, py::arg("rank") = 0,
          py::arg("call_timeout") = 5.0,
          "A client of a new store in this process (no tierkvd).")
      .def("close", &PyClient::Close,
           "Detaches (waiting for copies in flight, and for a call another "
           "thread runs on the client: at most its call_timeout, or the "
           "100 ms slice of a long wait). host_block() views still alive "
           "keep the attachment until they are released.")
      .def("__repr__",
           [](const PyClient& c) {
             if (c.closed()) return std::string("Client(closed)");
             return c.Call([](Client& x) {
               return "Client(worker_id=" + std::to_string(x.worker_id()) +
                      ", copies='" + CopyModeName(x.copies()) +
                      "', embedded=" + (x.embedded() ? "True" : "False") +
                      ", connected=" + (x.connected() ? "True" : "False") + ")";
             });
           })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& c, const py::args&) {
        c.Close();
        return false;
      });
  RegisterMethods(cls);
  RegisterProperties(cls);
}

}  // namespace tierkv::python
