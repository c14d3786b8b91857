#include "tierkv/request.h"

#include <algorithm>
#include <utility>

namespace tierkv {

Request::Request(RequestId id, std::vector<TokenId> tokens, int32_t block_size,
                 const KeyHasher& hasher, RequestExtras extras)
    : Request(id, std::move(tokens), block_size, &hasher, std::move(extras)) {}

Request::Request(RequestId id, std::vector<TokenId> tokens, int32_t block_size,
                 const KeyHasher* hasher, RequestExtras extras)
    : id_(id),
      block_size_(block_size),
      tokens_(std::move(tokens)),
      hasher_(hasher),
      extras_(std::move(extras)) {
  if (hasher_ != nullptr) {
    hasher_->AppendPrefixKeys(tokens_, block_size_, extras_, &keys_);
  }
}

Request Request::WithKeys(RequestId id, std::vector<TokenId> tokens,
                          int32_t block_size, std::vector<BlockKey> keys) {
  Request r(id, std::move(tokens), block_size, nullptr, RequestExtras{});
  const size_t max_keys =
      block_size < 1 ? 0 : r.tokens_.size() / static_cast<size_t>(block_size);
  keys.resize(std::min(keys.size(), max_keys));
  r.keys_ = std::move(keys);
  return r;
}

std::span<const TokenId> Request::block_tokens(int32_t index) const {
  const size_t start = static_cast<size_t>(index) * block_size_;
  if (index < 0 || start >= tokens_.size()) return {};
  const size_t len = std::min<size_t>(block_size_, tokens_.size() - start);
  return std::span<const TokenId>(tokens_).subspan(start, len);
}

void Request::AppendToken(TokenId token) {
  tokens_.push_back(token);
  if (hasher_ != nullptr && block_size_ > 0 &&
      tokens_.size() % static_cast<size_t>(block_size_) == 0) {
    hasher_->AppendPrefixKeys(tokens_, block_size_, extras_, &keys_);
  }
}

}  // namespace tierkv
