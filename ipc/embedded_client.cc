// OpenEmbedded (tierkv/embedded.h): a worker client over a TieredStore in
// the engine's own process.
#include <sys/eventfd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "ipc/in_process_store.h"
#include "ipc/service.h"
#include "ipc/unique_fd.h"
#include "tierkv/embedded.h"
#include "tiers/tiered_store.h"

namespace tierkv {
namespace {

class EmbeddedStore final : public ipc::InProcessStore {
 public:
  // `ready` is the eventfd the store's loads_ready callback writes.
  EmbeddedStore(std::shared_ptr<ipc::UniqueFd> ready,
                std::unique_ptr<TieredStore> store)
      : ready_(std::move(ready)), store_(std::move(store)) {}

  StatusOr<WorkerId> RegisterWorker(
      const WorkerRegistration& registration) override {
    return store_->WithCoordinator(
        [&](Coordinator& c) { return c.RegisterWorker(registration); });
  }
  ipc::Message Call(WorkerId worker, const ipc::Message& request) override {
    return ipc::DispatchToStore(*store_, worker, request);
  }
  const HostTier& host() const override { return store_->host(); }
  int ready_fd() const override { return ready_->get(); }

 private:
  std::shared_ptr<ipc::UniqueFd> ready_;
  std::unique_ptr<TieredStore> store_;
};

}  // namespace

StatusOr<std::unique_ptr<Client>> OpenEmbedded(
    const ClientOptions& options, const EmbeddedOptions& embedded) {
  if (!options.socket_path.empty()) {
    return Status::InvalidArgument(
        "an embedded client attaches to no tierkvd: socket_path must be "
        "empty, not " +
        options.socket_path);
  }
  TIERKV_RETURN_IF_ERROR(options.layout.Validate());
  TIERKV_RETURN_IF_ERROR(ValidateModelName(options.model));
  const size_t slot_bytes = options.layout.BlockBytes();
  TieredStoreOptions store;
  store.layout = options.layout;
  store.model = options.model;
  store.host.num_slots = HostTier::SlotsFor(embedded.host_bytes, slot_bytes);
  // The engine is the store's only worker: it may pin every slot.
  store.caps.worker_pin_share = 1;
  if (!embedded.disk_path.empty()) {
    TIERKV_ASSIGN_OR_RETURN(
        store.disk, DiskTier::Open({.storage = {.path = embedded.disk_path},
                                    .capacity_bytes = embedded.disk_bytes,
                                    .layout_fingerprint = StoreFingerprint(
                                        options.layout, options.model),
                                    .block_bytes = slot_bytes,
                                    .element_bytes = static_cast<int32_t>(
                                        options.layout.ElementSize())}));
  }
  // One worker, so one readiness eventfd; the store's callback keeps it
  // open for as long as it may write it.
  auto ready =
      std::make_shared<ipc::UniqueFd>(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!ready->valid()) {
    return Status::ResourceExhausted(std::string("eventfd: ") +
                                     std::strerror(errno));
  }
  store.loads_ready = [ready](WorkerId) {
    (void)eventfd_write(ready->get(), 1);
  };
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<TieredStore> tiered,
                          TieredStore::Open(std::move(store)));
  return Client::OpenInProcess(
      options,
      std::make_unique<EmbeddedStore>(std::move(ready), std::move(tiered)));
}

}  // namespace tierkv
