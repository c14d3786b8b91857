// The SentencePiece-style BPE tokenizer of llama2.c checkpoints
// (github.com/karpathy/llama2.c, `tokenizer.bin`), for the reference
// model's real-text mode: text to token ids the way the model was trained,
// and ids back to text. Immutable after Load; safe to share between threads.
//
// tokenizer.bin: an int32 maximum piece length, then per token id a float
// merge score, an int32 byte length and the piece's bytes. Pieces use plain
// spaces where SentencePiece writes U+2581. Ids 0, 1 and 2 are <unk>, BOS
// and EOS; ids 3 to 258 are the byte-fallback tokens for bytes 0 to 255,
// reached only by id: their pieces are "<0x00>" in some exports and the
// byte itself in others (stories15M's), which then repeats pieces such as
// " " and "," that text must map to their ordinary ids.
#ifndef TIERKV_TESTING_TOKENIZER_H_
#define TIERKV_TESTING_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv {

class Tokenizer {
 public:
  static constexpr TokenId kBos = 1;
  static constexpr TokenId kEos = 2;
  static constexpr TokenId kFirstByteToken = 3;  // <0x00>.
  // The first ordinary piece, after the 256 byte-fallback tokens.
  static constexpr int32_t kFirstPieceToken = 3 + 256;

  // Reads a tokenizer.bin for a model of `vocab_size` tokens. InvalidArgument
  // (naming the file and the offset) for a file that ends early, has a
  // negative length or a different number of tokens; NotFound if it cannot
  // be opened.
  static StatusOr<Tokenizer> Load(const std::string& path, int32_t vocab_size);

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }

  // SentencePiece's encoding as llama2.c runs it: BOS first if `bos`; a
  // leading space (SentencePiece's dummy prefix) when `text` is not empty;
  // each UTF-8 character its own piece, or its bytes as byte-fallback
  // tokens when the vocabulary lacks it (so any bytes encode, malformed
  // UTF-8 included); then, repeatedly, the adjacent pair of ordinary pieces
  // whose joined piece has the highest score (the leftmost on a tie) is
  // merged until none is in the vocabulary. Byte-fallback tokens never
  // merge.
  std::vector<TokenId> Encode(std::string_view text, bool bos) const;

  // The text of `token` following `previous`: byte-fallback ids give their
  // byte; the leading space of the first piece after BOS is dropped (the
  // dummy prefix); BOS and EOS give nothing. An id outside the vocabulary
  // gives nothing.
  std::string Decode(TokenId previous, TokenId token) const;
  // Decode over a sequence, `previous` being the token before tokens[0].
  std::string DecodeAll(const std::vector<TokenId>& tokens,
                        TokenId previous = kBos) const;

 private:
  Tokenizer() = default;

  // The id of `piece`, or -1.
  int32_t Find(std::string_view piece) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> ids_;
};

}  // namespace tierkv

#endif  // TIERKV_TESTING_TOKENIZER_H_
