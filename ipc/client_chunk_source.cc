#include "tierkv/client_chunk_source.h"

#include <string>
#include <vector>

namespace tierkv {

ClientChunkSource::ClientChunkSource(Client* client,
                                     const ClientChunkSourceOptions& options)
    : client_(client), options_(options) {}

StatusOr<bool> ClientChunkSource::Fetch(std::span<const TokenId> chunk,
                                        const AllocateBlocks& allocate) {
  TIERKV_RETURN_IF_ERROR(ReattachIfLost());
  const RequestId request = next_request_++;
  ++stats_.fetches;
  TIERKV_ASSIGN_OR_RETURN(LookupResult hit,
                          client_->LookupChunk(request, chunk));
  const auto n = static_cast<int32_t>(chunk.size());
  // Part of a chunk is of no use to the pool, which holds whole chunks.
  if (hit.hit_tokens < n) {
    ++stats_.misses;
    TIERKV_RETURN_IF_ERROR(client_->Finish(request));
    return false;
  }
  const int32_t block_size = client_->layout().block_size;
  StatusOr<std::vector<BlockId>> blocks =
      allocate((n + block_size - 1) / block_size);
  StatusOr<AllocateResult> load =
      blocks.ok() ? client_->Allocate(request, *blocks, n)
                  : StatusOr<AllocateResult>(blocks.status());
  Status status = load.status();
  if (status.ok() && load->load.has_value()) {
    status = WaitFor(load->load->ref);
  }
  // Finish also drops the pins of a lookup that was never allocated.
  const Status finished = client_->Finish(request);
  if (status.code() == StatusCode::kDataLoss) {
    ++stats_.failed;
    return false;
  }
  TIERKV_RETURN_IF_ERROR(status);
  TIERKV_RETURN_IF_ERROR(finished);
  if (!load->load.has_value()) return false;
  ++(hit.disk_hit_tokens > 0 ? stats_.disk_hits : stats_.host_hits);
  return true;
}

Status ClientChunkSource::Publish(std::span<const TokenId> chunk,
                                  std::span<const BlockId> blocks) {
  TIERKV_RETURN_IF_ERROR(ReattachIfLost());
  const RequestId request = next_request_++;
  ++stats_.publishes;
  const auto n = static_cast<int32_t>(chunk.size());
  Status status = client_->LookupChunk(request, chunk).status();
  if (status.ok()) status = client_->Allocate(request, blocks, 0).status();
  StatusOr<CommitResult> commit = status.ok()
                                      ? client_->Commit(request, n, blocks)
                                      : StatusOr<CommitResult>(status);
  status = commit.status();
  if (status.ok()) {
    for (const TransferEvent& store : commit->stores) {
      if (Status s = WaitFor(store.ref); !s.ok() && status.ok()) status = s;
    }
  }
  const Status finished = client_->Finish(request);
  TIERKV_RETURN_IF_ERROR(status);
  return finished;
}

Status ClientChunkSource::ReattachIfLost() {
  if (client_->connected()) return Status::Ok();
  // Copies of the lost attachment are over once Reconnect returns; what
  // they hand back is completed (which only unpins) and dropped.
  Status s = client_->Reconnect();
  TIERKV_RETURN_IF_ERROR(client_->Complete(client_->PollEvents()));
  return s;
}

Status ClientChunkSource::WaitFor(const EventRef& ref) {
  const uint64_t session = client_->session();
  const auto deadline =
      std::chrono::steady_clock::now() + options_.copy_timeout;
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
    TIERKV_RETURN_IF_ERROR(client_->Complete(finished));
    if (found) return mine;
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::Unavailable(
          std::string(ref.kind == EventKind::kLoad ? "load" : "store") +
          " event " + std::to_string(ref.id) + " did not finish within " +
          std::to_string(options_.copy_timeout.count()) + " ms");
    }
  }
}

}  // namespace tierkv
