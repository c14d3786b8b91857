#include "tierkv/client_chunk_source.h"

#include <algorithm>
#include <string>
#include <vector>

namespace tierkv {

ClientChunkSource::ClientChunkSource(Client* client,
                                     const ClientChunkSourceOptions& options)
    : client_(client), options_(options) {}

const KvLayout& ClientChunkSource::layout() const { return client_->layout(); }

Status ClientChunkSource::CheckPool(std::span<const std::byte> memory,
                                    int32_t num_blocks) const {
  const std::string refused = "chunk tier: the client cannot serve the pool: ";
  if (client_->copies() != CopyMode::kClient) {
    return Status::FailedPrecondition(
        refused + "its copies are made by " +
        (client_->copies() == CopyMode::kRanks ? "its ranks" : "its caller") +
        "; a chunk pool's client copies itself (CopyMode::kClient)");
  }
  DeviceTier* device = client_->device();
  const size_t block_bytes = client_->layout().BlockBytes();
  if (device == nullptr || device->num_blocks() != num_blocks ||
      device->block_bytes() != block_bytes) {
    return Status::FailedPrecondition(
        refused + "its device tier is not of the pool's " +
        std::to_string(num_blocks) + " blocks of " +
        std::to_string(block_bytes) +
        " bytes (build it over ChunkKvStore::memory(), "
        "EmulatedDeviceTier::CreateOver)");
  }
  auto* emulated = dynamic_cast<EmulatedDeviceTier*>(device);
  if (emulated != nullptr && emulated->block(0).data() != memory.data()) {
    return Status::FailedPrecondition(
        refused +
        "its emulated device tier has memory of its own, not the pool's "
        "(EmulatedDeviceTier::CreateOver(ChunkKvStore::memory(), ...))");
  }
  return Status::Ok();
}

StatusOr<bool> ClientChunkSource::Fetch(std::span<const TokenId> chunk,
                                        int64_t virtual_start,
                                        const BlockKey& variant,
                                        const AllocateBlocks& allocate) {
  copy_stuck_ = false;
  lease_.reset();
  StatusOr<bool> fetched = FetchOnce(chunk, virtual_start, variant, allocate);
  if (fetched.ok()) return fetched;
  return OnlyStuckCopiesExceedTheDeadline(fetched.status());
}

Status ClientChunkSource::Publish(std::span<const TokenId> chunk,
                                  int64_t virtual_start,
                                  const BlockKey& variant,
                                  std::span<const BlockId> blocks) {
  copy_stuck_ = false;
  lease_.reset();
  return OnlyStuckCopiesExceedTheDeadline(
      PublishOnce(chunk, virtual_start, variant, blocks));
}

Status ClientChunkSource::Abandon(std::span<const TokenId> chunk,
                                  int64_t virtual_start,
                                  const BlockKey& variant) {
  if (!lease_.has_value() || lease_->virtual_start != virtual_start ||
      !(lease_->variant == variant) ||
      !std::ranges::equal(lease_->chunk, chunk)) {
    return Status::Ok();
  }
  const RequestId request = lease_->request;
  lease_.reset();
  if (!client_->connected()) return Status::Ok();  // Gone with the attachment.
  const Status finished = client_->Finish(request);
  // Not known: the lease ended otherwise, with nothing left to end.
  if (finished.code() == StatusCode::kNotFound) return Status::Ok();
  return finished;
}

Status ClientChunkSource::OnlyStuckCopiesExceedTheDeadline(
    Status status) const {
  // A publish's first error may be another store's: a stuck copy wins.
  if (copy_stuck_) return Status::DeadlineExceeded(status.message());
  if (status.code() != StatusCode::kDeadlineExceeded) return status;
  return Status::Unavailable(status.message());
}

StatusOr<bool> ClientChunkSource::FetchOnce(std::span<const TokenId> chunk,
                                            int64_t virtual_start,
                                            const BlockKey& variant,
                                            const AllocateBlocks& allocate) {
  TIERKV_RETURN_IF_ERROR(ReattachIfLost());
  const RequestId request = next_request_++;
  ++stats_.fetches;
  TIERKV_ASSIGN_OR_RETURN(
      ChunkFetchResult fetch,
      client_->FetchChunk(request, chunk, options_.single_flight_wait, allocate,
                          virtual_start, variant));
  if (fetch.lease) {
    ++stats_.leases;
    lease_ = Lease{.request = request,
                   .chunk = {chunk.begin(), chunk.end()},
                   .virtual_start = virtual_start,
                   .variant = variant};
  }
  if (fetch.waited) ++stats_.waited;
  // Part of a chunk is of no use to the pool, which holds whole chunks.
  if (fetch.lookup.hit_tokens < static_cast<int32_t>(chunk.size())) {
    ++stats_.misses;
    return false;
  }
  if (!fetch.load.has_value()) return FetchFromDisk(request, chunk, allocate);
  if (fetch.load->failed_blocks > 0) {
    ++stats_.failed;  // Released by FetchChunk; nothing copied.
    return false;
  }
  const Status status = WaitFor(fetch.load->ref, /*finish=*/0);
  if (status.code() == StatusCode::kDataLoss) {
    ++stats_.failed;
    return false;
  }
  TIERKV_RETURN_IF_ERROR(status);
  ++stats_.host_hits;
  return true;
}

StatusOr<bool> ClientChunkSource::FetchFromDisk(
    RequestId request, std::span<const TokenId> chunk,
    const AllocateBlocks& allocate) {
  const auto n = static_cast<int32_t>(chunk.size());
  const int32_t block_size = client_->layout().block_size;
  StatusOr<std::vector<BlockId>> blocks =
      allocate((n + block_size - 1) / block_size);
  StatusOr<AllocateResult> load =
      blocks.ok() ? client_->Allocate(request, *blocks, n)
                  : StatusOr<AllocateResult>(blocks.status());
  if (!load.ok() || !load->load.has_value()) {
    // Finish also drops the pins of a lookup that was never allocated.
    const Status finished = client_->Finish(request);
    TIERKV_RETURN_IF_ERROR(load.status());
    TIERKV_RETURN_IF_ERROR(finished);
    ++stats_.misses;
    return false;
  }
  const Status status = WaitFor(load->load->ref, request);
  if (status.code() == StatusCode::kDataLoss) {
    ++stats_.failed;
    return false;
  }
  TIERKV_RETURN_IF_ERROR(status);
  ++stats_.disk_hits;
  return true;
}

Status ClientChunkSource::PublishOnce(std::span<const TokenId> chunk,
                                      int64_t virtual_start,
                                      const BlockKey& variant,
                                      std::span<const BlockId> blocks) {
  TIERKV_RETURN_IF_ERROR(ReattachIfLost());
  const RequestId request = next_request_++;
  ++stats_.publishes;
  TIERKV_ASSIGN_OR_RETURN(
      CommitResult commit,
      client_->PublishChunk(request, chunk, blocks, virtual_start, variant));
  Status status;
  for (const TransferEvent& store : commit.stores) {
    if (Status s = WaitFor(store.ref, 0); !s.ok() && status.ok()) status = s;
  }
  if (status.ok() && commit.skipped_blocks > 0) {
    // Part of the chunk is of no use to another worker's fetch.
    status = Status::ResourceExhausted(
        std::to_string(commit.skipped_blocks) +
        " block(s) of the chunk were not stored: " +
        (commit.store_status.ok()
             ? std::string("no host slot was free, or an operator is "
                           "dropping the key")
             : std::string(commit.store_status.message())));
  }
  return status;
}

Status ClientChunkSource::ReattachIfLost() {
  if (client_->connected()) return Status::Ok();
  // Copies of the lost attachment are over once Reconnect returns; what
  // they hand back is completed (which only unpins) and dropped.
  Status s = client_->Reconnect();
  TIERKV_RETURN_IF_ERROR(client_->Complete(client_->PollEvents()));
  return s;
}

Status ClientChunkSource::WaitFor(const EventRef& ref, RequestId finish) {
  const uint64_t session = client_->session();
  const auto deadline =
      std::chrono::steady_clock::now() + options_.copy_timeout;
  bool timed_out = false;
  for (;;) {
    std::vector<FinishedTransfer> finished =
        client_->WaitEvents(std::chrono::milliseconds(10));
    Status mine;
    bool found = false;
    for (const FinishedTransfer& f : finished) {
      if (!(f.event.ref == ref) || f.session != session) continue;
      found = true;
      mine = f.status;
      if (mine.ok() && f.event.failed_blocks > 0) {
        mine = Status::DataLoss(std::to_string(f.event.failed_blocks) +
                                " block(s) of the chunk could not be read "
                                "from the disk tier");
      }
    }
    TIERKV_RETURN_IF_ERROR(
        client_->CompleteOneWay(finished, found && !timed_out ? finish : 0));
    if (found) return mine;  // Whole, even when it ended past the deadline.
    if (!timed_out && std::chrono::steady_clock::now() > deadline) {
      timed_out = true;
      // Also cancels the load should it still wait for promotions.
      if (finish != 0) (void)client_->Finish(finish);
    }
    // A copy already running writes the blocks (a load) or reads them (a
    // store) until it ends: the pool must not have them back before.
    const char* kind = ref.kind == EventKind::kLoad ? "load" : "store";
    if (timed_out && !client_->copying(ref)) {
      return Status::Unavailable(
          std::string(kind) + " event " + std::to_string(ref.id) +
          " did not finish within " +
          std::to_string(options_.copy_timeout.count()) + " ms");
    }
    if (timed_out && std::chrono::steady_clock::now() >
                         deadline + options_.stuck_copy_timeout) {
      ++stats_.stuck_copies;
      copy_stuck_ = true;
      return Status::DeadlineExceeded(
          "the device tier's copy of " + std::string(kind) + " event " +
          std::to_string(ref.id) + " still runs " +
          std::to_string(
              (options_.copy_timeout + options_.stuck_copy_timeout).count()) +
          " ms on (copy_timeout + stuck_copy_timeout); its blocks are "
          "never reused");
    }
  }
}

}  // namespace tierkv
