#include "testing/tokenizer.h"

#include <cstring>
#include <limits>
#include <utility>

#include "testing/reference_model_internal.h"

namespace tierkv {
namespace {

using reference_internal::ReadWholeFile;

// Reads fixed-size values off a byte string, failing with the offset.
class Reader {
 public:
  Reader(const std::string& path, const std::string& bytes)
      : path_(path), bytes_(bytes) {}

  template <typename T>
  StatusOr<T> Next(const char* what) {
    T value;
    TIERKV_RETURN_IF_ERROR(Bytes(sizeof(T), what, &value));
    return value;
  }
  Status Bytes(size_t n, const char* what, void* out) {
    if (bytes_.size() - pos_ < n) {
      return Status::InvalidArgument(path_ + ": ends at byte " +
                                     std::to_string(bytes_.size()) +
                                     " inside " + what);
    }
    std::memcpy(out, bytes_.data() + pos_, n);
    pos_ += n;
    return Status::Ok();
  }
  size_t pos() const { return pos_; }

 private:
  const std::string& path_;
  const std::string& bytes_;
  size_t pos_ = 0;
};

// Bytes in the character starting at text[i]: the byte and the UTF-8
// continuation bytes (10xxxxxx) after it, at most 4 in all, whatever the
// first byte is (llama2.c's grouping; a malformed sequence then matches no
// piece and falls back to its bytes).
size_t CharLength(std::string_view text, size_t i) {
  size_t len = 1;
  while (len < 4 && i + len < text.size() &&
         (static_cast<unsigned char>(text[i + len]) & 0xC0) == 0x80) {
    ++len;
  }
  return len;
}

}  // namespace

StatusOr<Tokenizer> Tokenizer::Load(const std::string& path,
                                    int32_t vocab_size) {
  TIERKV_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  Reader in(path, bytes);
  TIERKV_ASSIGN_OR_RETURN(int32_t max_length,
                          in.Next<int32_t>("the maximum piece length"));
  if (max_length <= 0) {
    return Status::InvalidArgument(path + ": maximum piece length " +
                                   std::to_string(max_length));
  }
  if (vocab_size < kFirstPieceToken) {
    return Status::InvalidArgument(
        path + ": a vocabulary of " + std::to_string(vocab_size) +
        " tokens has no room for the control and byte-fallback tokens");
  }
  Tokenizer t;
  t.pieces_.reserve(static_cast<size_t>(vocab_size));
  t.scores_.reserve(static_cast<size_t>(vocab_size));
  while (in.pos() < bytes.size()) {
    const std::string where = "token " + std::to_string(t.pieces_.size());
    TIERKV_ASSIGN_OR_RETURN(float score, in.Next<float>(where.c_str()));
    TIERKV_ASSIGN_OR_RETURN(int32_t length, in.Next<int32_t>(where.c_str()));
    if (length < 0 || length > max_length) {
      return Status::InvalidArgument(path + ": " + where + " has length " +
                                     std::to_string(length));
    }
    std::string piece(static_cast<size_t>(length), '\0');
    TIERKV_RETURN_IF_ERROR(in.Bytes(piece.size(), where.c_str(), piece.data()));
    t.pieces_.push_back(std::move(piece));
    t.scores_.push_back(score);
  }
  if (t.vocab_size() != vocab_size) {
    return Status::InvalidArgument(
        path + ": " + std::to_string(t.vocab_size()) +
        " tokens, but the model has " + std::to_string(vocab_size));
  }
  // Control and byte-fallback tokens are reached only by id: their pieces
  // (in older exports, the byte itself, so " " and "," twice) must never
  // win a lookup of text.
  for (int32_t id = kFirstPieceToken; id < vocab_size; ++id) {
    // The first of two equal pieces wins, as in a sorted-vocabulary search.
    t.ids_.emplace(t.pieces_[static_cast<size_t>(id)], id);
  }
  return t;
}

int32_t Tokenizer::Find(std::string_view piece) const {
  auto it = ids_.find(std::string(piece));
  return it == ids_.end() ? -1 : it->second;
}

std::vector<TokenId> Tokenizer::Encode(std::string_view text, bool bos) const {
  std::vector<int32_t> ids;
  if (!text.empty()) {
    const int32_t space = Find(" ");
    if (space >= 0) ids.push_back(space);
  }
  for (size_t i = 0; i < text.size();) {
    const size_t len = CharLength(text, i);
    const int32_t id = Find(text.substr(i, len));
    if (id >= 0) {
      ids.push_back(id);
    } else {
      for (size_t k = 0; k < len; ++k) {
        ids.push_back(kFirstByteToken +
                      static_cast<unsigned char>(text[i + k]));
      }
    }
    i += len;
  }
  while (ids.size() > 1) {
    float best_score = -std::numeric_limits<float>::infinity();
    int32_t best_id = -1;
    size_t best_at = 0;
    std::string joined;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      // Byte-fallback tokens never merge (SentencePiece adds them last).
      if (ids[i] < kFirstPieceToken || ids[i + 1] < kFirstPieceToken) continue;
      joined = pieces_[static_cast<size_t>(ids[i])];
      joined += pieces_[static_cast<size_t>(ids[i + 1])];
      const int32_t id = Find(joined);
      if (id >= 0 &&
          (best_id < 0 || scores_[static_cast<size_t>(id)] > best_score)) {
        best_score = scores_[static_cast<size_t>(id)];
        best_id = id;
        best_at = i;
      }
    }
    if (best_id < 0) break;
    ids[best_at] = best_id;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
  }
  std::vector<TokenId> out;
  out.reserve(ids.size() + 1);
  if (bos) out.push_back(kBos);
  for (int32_t id : ids) out.push_back(static_cast<TokenId>(id));
  return out;
}

std::string Tokenizer::Decode(TokenId previous, TokenId token) const {
  if (token == kBos || token == kEos || token >= pieces_.size()) return {};
  if (token >= kFirstByteToken && token < kFirstByteToken + 256) {
    return std::string(1, static_cast<char>(token - kFirstByteToken));
  }
  std::string_view piece = pieces_[token];
  if (previous == kBos && !piece.empty() && piece.front() == ' ') {
    piece.remove_prefix(1);
  }
  return std::string(piece);
}

std::string Tokenizer::DecodeAll(const std::vector<TokenId>& tokens,
                                 TokenId previous) const {
  std::string out;
  for (TokenId t : tokens) {
    out += Decode(previous, t);
    previous = t;
  }
  return out;
}

}  // namespace tierkv
