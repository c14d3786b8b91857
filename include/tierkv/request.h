// Request: one sequence's token ids and the keys of its full blocks, kept
// in step as tokens are appended (vLLM computes block hashes once per request
// the same way). Not thread-safe; owned by the engine's scheduler.
#ifndef TIERKV_INCLUDE_TIERKV_REQUEST_H_
#define TIERKV_INCLUDE_TIERKV_REQUEST_H_

#include <cstdint>
#include <span>
#include <vector>

#include "tierkv/block_key.h"
#include "tierkv/types.h"

namespace tierkv {

class Request {
 public:
  // Keys are computed by `hasher`, which must outlive the request.
  Request(RequestId id, std::vector<TokenId> tokens, int32_t block_size,
          const KeyHasher& hasher, RequestExtras extras = {});

  // Keys supplied by the caller, e.g. computed by a worker. A hit still
  // needs the block's stored token ids to match, but a key list that does not
  // chain (another prefix, LoRA or image behind the same tokens) is taken at
  // its word: only trusted callers may supply keys. Appended tokens get no
  // new keys.
  static Request WithKeys(RequestId id, std::vector<TokenId> tokens,
                          int32_t block_size, std::vector<BlockKey> keys);

  RequestId id() const { return id_; }
  int32_t block_size() const { return block_size_; }
  int32_t num_tokens() const { return static_cast<int32_t>(tokens_.size()); }
  std::span<const TokenId> tokens() const { return tokens_; }
  // Token ids of block `index` (the last block may be partial); empty past
  // the end.
  std::span<const TokenId> block_tokens(int32_t index) const;
  // Keys of the leading full blocks; at most num_tokens() / block_size().
  const std::vector<BlockKey>& block_keys() const { return keys_; }

  // Appends a generated token; keys the block it completes.
  void AppendToken(TokenId token);

 private:
  Request(RequestId id, std::vector<TokenId> tokens, int32_t block_size,
          const KeyHasher* hasher, RequestExtras extras);

  RequestId id_;
  int32_t block_size_;
  std::vector<TokenId> tokens_;
  std::vector<BlockKey> keys_;
  const KeyHasher* hasher_;  // Null when keys were supplied.
  RequestExtras extras_;
};

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_REQUEST_H_
