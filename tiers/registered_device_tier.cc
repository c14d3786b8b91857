// RegisteredDeviceTier: copies between memory the engine registered (per
// layer a K and a V base, a block stride and a token stride) and host slots
// in KvLayout's geometry, on the CopyEngine's thread (jobs strictly in
// submission order, an empty job a fence: tiers/copy_engine.h).
//
// Decisions the header leaves open:
// - num_heads 0 is every head from first_head on; options() reports it and
//   each layer's token_stride resolved, never 0.
// - A shard reads and writes only its own heads' bytes of a host block: the
//   other ranks' heads stay as they are, so ranks may fill one slot in any
//   order, concurrently.
// - Validation checks each layer's own strides (a block's tokens do not run
//   into the next block) but not whether two layers' or planes' memory
//   overlaps: interleaved layouts (cross-layer, FlashInfer's) legitimately
//   share address ranges, and the memory is the engine's to lay out.
// - One plane is one memcpy when the shard is every head and its tokens are
//   densely packed, as the host's are (vLLM's layout with one rank); a
//   shard or a strided layout moves one run of its heads per token, stored
//   into the host slot with non-temporal stores (StreamToHost).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tierkv/device_tier.h"
#include "tiers/copy_engine.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tierkv {
namespace {

Status Invalid(const std::string& what) {
  return Status::InvalidArgument("registered device tier: " + what);
}

std::string LayerField(size_t layer, const char* field) {
  return "layers[" + std::to_string(layer) + "]." + field;
}

// Checks the head range and resolves num_heads 0 (every head from
// first_head on).
Status ResolveHeads(RegisteredDeviceOptions& options) {
  const int32_t heads = options.layout.num_kv_heads;
  const std::string of_layout =
      " (layout.num_kv_heads is " + std::to_string(heads) + ")";
  if (options.first_head < 0 || options.first_head >= heads) {
    return Invalid("first_head " + std::to_string(options.first_head) +
                   " is outside [0, " + std::to_string(heads) + ")" +
                   of_layout);
  }
  if (options.num_heads < 0 || options.num_heads > heads - options.first_head) {
    return Invalid("num_heads " + std::to_string(options.num_heads) +
                   " from first_head " + std::to_string(options.first_head) +
                   " runs past the last head" + of_layout);
  }
  if (options.num_heads == 0) options.num_heads = heads - options.first_head;
  return Status::Ok();
}

// Checks one layer's pointers and strides for `run` bytes per token and
// resolves token_stride 0 (densely packed tokens).
Status ResolveLayer(size_t index, LayerMemory& layer, size_t run,
                    int32_t block_size, int32_t num_blocks) {
  if (layer.key == nullptr)
    return Invalid(LayerField(index, "key") + " is null");
  if (layer.value == nullptr) {
    return Invalid(LayerField(index, "value") + " is null");
  }
  const std::string run_text = std::to_string(run) + " bytes";
  if (layer.token_stride == 0) layer.token_stride = run;
  if (layer.token_stride < run) {
    return Invalid(LayerField(index, "token_stride") + " " +
                   std::to_string(layer.token_stride) +
                   " is smaller than one token's heads of this shard (" +
                   run_text + "): tokens would overlap");
  }
  const size_t max = std::numeric_limits<size_t>::max();
  const size_t gaps = static_cast<size_t>(block_size) - 1;
  if (gaps > 0 && layer.token_stride > (max - run) / gaps) {
    return Invalid(LayerField(index, "token_stride") + " " +
                   std::to_string(layer.token_stride) +
                   " overflows the address space over " +
                   std::to_string(block_size) + " tokens");
  }
  const size_t extent = gaps * layer.token_stride + run;
  if (layer.block_stride < extent) {
    return Invalid(LayerField(index, "block_stride") + " " +
                   std::to_string(layer.block_stride) +
                   " is smaller than one block's tokens (" +
                   std::to_string(extent) + " bytes): blocks would overlap");
  }
  const size_t later_blocks = static_cast<size_t>(num_blocks) - 1;
  if (later_blocks > 0 && layer.block_stride > (max - extent) / later_blocks) {
    return Invalid(LayerField(index, "block_stride") + " " +
                   std::to_string(layer.block_stride) + " over " +
                   std::to_string(num_blocks) +
                   " blocks overflows the address space");
  }
  return Status::Ok();
}

Status ResolveOptions(RegisteredDeviceOptions& options) {
  const KvLayout& layout = options.layout;
  if (Status valid = layout.Validate(); !valid.ok()) {
    return Invalid("layout: " + valid.message());
  }
  if (options.num_blocks < 1) {
    return Invalid("num_blocks must be at least 1, got " +
                   std::to_string(options.num_blocks));
  }
  if (options.layers.size() != static_cast<size_t>(layout.num_layers)) {
    return Invalid("layers has " + std::to_string(options.layers.size()) +
                   " entries but layout.num_layers is " +
                   std::to_string(layout.num_layers) +
                   ": register one LayerMemory per layer, in layer order");
  }
  TIERKV_RETURN_IF_ERROR(ResolveHeads(options));
  const size_t run = static_cast<size_t>(options.num_heads) * layout.head_dim *
                     layout.ElementSize();
  for (size_t l = 0; l < options.layers.size(); ++l) {
    TIERKV_RETURN_IF_ERROR(ResolveLayer(l, options.layers[l], run,
                                        layout.block_size, options.num_blocks));
  }
  // Every plane (a layer's K or V) is memory of its own: one tensor given
  // for two layers, or for K and V, would make every copy of one read and
  // write the other's bytes, stored and served as both. Checked on the
  // first token of the first block, which no legitimate layout (interleaved
  // by block, layer or token) shares between planes.
  std::vector<std::pair<const std::byte*, std::string>> firsts;
  for (size_t l = 0; l < options.layers.size(); ++l) {
    firsts.emplace_back(options.layers[l].key, LayerField(l, "key"));
    firsts.emplace_back(options.layers[l].value, LayerField(l, "value"));
  }
  std::ranges::sort(firsts, {}, [](const auto& f) { return f.first; });
  for (size_t i = 1; i < firsts.size(); ++i) {
    if (firsts[i].first < firsts[i - 1].first + run) {
      return Invalid(firsts[i - 1].second + " and " + firsts[i].second +
                     " overlap: each layer's key and value must be memory "
                     "of its own (the same tensor given twice?)");
    }
  }
  return Status::Ok();
}

// Copies a shard's run into a host slot with non-temporal stores, which
// write whole cache lines without reading them first. A plain memcpy of a
// run this short uses ordinary stores, and a rank writing every other run of
// a slot then reads as many bytes as it writes: streaming doubles the
// throughput of a TP=2 store. The caller issues StreamFence before
// publishing the job. Falls back to memcpy off x86 or for a destination not
// 16-byte aligned.
inline void StreamToHost(std::byte* host, const std::byte* device,
                         size_t bytes) {
#if defined(__SSE2__)
  if ((reinterpret_cast<uintptr_t>(host) & 15) == 0) {
    auto* to = reinterpret_cast<__m128i*>(host);
    const auto* from = reinterpret_cast<const __m128i*>(device);
    const size_t vectors = bytes / 16;
    size_t i = 0;
    for (; i + 4 <= vectors; i += 4) {
      const __m128i a = _mm_loadu_si128(from + i);
      const __m128i b = _mm_loadu_si128(from + i + 1);
      const __m128i c = _mm_loadu_si128(from + i + 2);
      const __m128i d = _mm_loadu_si128(from + i + 3);
      _mm_stream_si128(to + i, a);
      _mm_stream_si128(to + i + 1, b);
      _mm_stream_si128(to + i + 2, c);
      _mm_stream_si128(to + i + 3, d);
    }
    for (; i < vectors; ++i)
      _mm_stream_si128(to + i, _mm_loadu_si128(from + i));
    const size_t done = vectors * 16;
    if (done < bytes) std::memcpy(host + done, device + done, bytes - done);
    return;
  }
#endif
  std::memcpy(host, device, bytes);
}

// Makes StreamToHost's stores visible to other threads and processes before
// the job's completion is.
inline void StreamFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace

struct RegisteredDeviceTier::Impl {
  // REQUIRES: `resolved` passed ResolveOptions.
  explicit Impl(RegisteredDeviceOptions resolved)
      : options(std::move(resolved)),
        run_bytes(static_cast<size_t>(options.num_heads) *
                  options.layout.head_dim * options.layout.ElementSize()),
        head_offset(static_cast<size_t>(options.first_head) *
                    options.layout.head_dim * options.layout.ElementSize()),
        all_heads(options.num_heads == options.layout.num_kv_heads) {}

  void Execute(const CopyJob& job) const {
    const bool store = job.direction == CopyDirection::kDeviceToHost;
    for (size_t i = 0; i < job.device_blocks.size(); ++i) {
      CopyBlock(store, job.device_blocks[i], job.host_blocks[i]);
    }
    if (store) StreamFence();
  }

  void CopyBlock(bool store, BlockId block, std::byte* host) const {
    const KvLayout& layout = options.layout;
    const size_t host_token_stride = layout.TokenStride();
    for (int32_t l = 0; l < layout.num_layers; ++l) {
      const LayerMemory& memory = options.layers[l];
      const size_t block_offset =
          static_cast<size_t>(block) * memory.block_stride;
      const bool dense = all_heads && memory.token_stride == run_bytes;
      for (KvPlane plane : {KvPlane::kKey, KvPlane::kValue}) {
        std::byte* device =
            (plane == KvPlane::kKey ? memory.key : memory.value) + block_offset;
        std::byte* slot = host + layout.Offset(l, plane, 0) + head_offset;
        if (dense) {
          // One memcpy per plane: as fast as memcpy of whole blocks
          // (store_load_bench), so no streaming of its own.
          if (store) {
            std::memcpy(slot, device, layout.PlaneBytes());
          } else {
            std::memcpy(device, slot, layout.PlaneBytes());
          }
          continue;
        }
        for (int32_t t = 0; t < layout.block_size; ++t) {
          std::byte* run = device + t * memory.token_stride;
          std::byte* host_run = slot + t * host_token_stride;
          if (store) {
            StreamToHost(host_run, run, run_bytes);
          } else {
            std::memcpy(run, host_run, run_bytes);
          }
        }
      }
    }
  }

  // Immutable after Create; read by any thread.
  const RegisteredDeviceOptions options;
  const size_t run_bytes;    // One token's heads of this shard in one plane.
  const size_t head_offset;  // Where the shard's heads start in a host token.
  const bool all_heads;

  // Declared last: destroyed (drained) before the options it copies with.
  std::unique_ptr<CopyEngine> engine;
};

StatusOr<std::unique_ptr<RegisteredDeviceTier>> RegisteredDeviceTier::Create(
    RegisteredDeviceOptions options) {
  TIERKV_RETURN_IF_ERROR(ResolveOptions(options));
  auto impl = std::make_unique<Impl>(std::move(options));
  auto execute = [raw = impl.get()](const CopyJob& job) { raw->Execute(job); };
  TIERKV_ASSIGN_OR_RETURN(impl->engine, CopyEngine::Start(std::move(execute)));
  return std::unique_ptr<RegisteredDeviceTier>(
      new RegisteredDeviceTier(std::move(impl)));
}

RegisteredDeviceTier::RegisteredDeviceTier(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

RegisteredDeviceTier::~RegisteredDeviceTier() = default;

int32_t RegisteredDeviceTier::num_blocks() const {
  return impl_->options.num_blocks;
}

size_t RegisteredDeviceTier::block_bytes() const {
  return impl_->options.layout.BlockBytes();
}

const RegisteredDeviceOptions& RegisteredDeviceTier::options() const {
  return impl_->options;
}

size_t RegisteredDeviceTier::shard_bytes() const {
  return 2 * static_cast<size_t>(impl_->options.layout.num_layers) *
         impl_->options.layout.block_size * impl_->run_bytes;
}

Status RegisteredDeviceTier::Submit(CopyJob job) {
  TIERKV_RETURN_IF_ERROR(ValidateCopyJob(job, impl_->options.num_blocks));
  impl_->engine->Submit(std::move(job));
  return Status::Ok();
}

std::vector<CopyCompletion> RegisteredDeviceTier::PollCompleted() {
  return impl_->engine->Poll();
}

std::vector<CopyCompletion> RegisteredDeviceTier::WaitCompleted(
    std::chrono::milliseconds timeout) {
  return impl_->engine->Wait(timeout);
}

size_t RegisteredDeviceTier::in_flight() const {
  return impl_->engine->in_flight();
}

bool RegisteredDeviceTier::SetCompletionNotify(std::function<void()> notify) {
  impl_->engine->SetNotify(std::move(notify));
  return true;
}

size_t RegisteredDeviceTier::RunQueuedCopies() {
  return impl_->engine->RunQueued();
}

Status RegisteredDeviceTier::SubmitForWaiter(CopyJob job) {
  TIERKV_RETURN_IF_ERROR(ValidateCopyJob(job, impl_->options.num_blocks));
  impl_->engine->Submit(std::move(job), /*wake=*/false);
  return Status::Ok();
}

void RegisteredDeviceTier::KickQueuedCopies() { impl_->engine->Kick(); }

}  // namespace tierkv
