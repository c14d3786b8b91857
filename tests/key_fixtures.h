// Fixed inputs whose keys must agree across processes and restarts. Shared
// by block_key_test and its child process key_dump.
#ifndef TIERKV_TESTS_KEY_FIXTURES_H_
#define TIERKV_TESTS_KEY_FIXTURES_H_

#include <numeric>
#include <string>
#include <vector>

#include "tierkv/block_key.h"

namespace tierkv::testing {

// One line per key: "<label> <32 hex digits>".
inline std::vector<std::string> FixtureKeyLines() {
  std::vector<std::string> lines;
  auto add = [&](const std::string& label, const BlockKey& key) {
    lines.push_back(label + " " + key.ToHex());
  };
  std::vector<TokenId> tokens(64);
  std::iota(tokens.begin(), tokens.end(), 1);

  const KeyHasher plain(KeyNamespace{"llama-3-8b/bf16/l32h8d128", ""});
  const KeyHasher tenant(KeyNamespace{"llama-3-8b/bf16/l32h8d128", "acme"});
  add("seq_root", plain.sequence_root());
  add("chunk_root", plain.chunk_root());
  add("tenant_root", tenant.sequence_root());

  std::vector<BlockKey> keys;
  plain.AppendPrefixKeys(tokens, 16, {}, &keys);
  for (size_t i = 0; i < keys.size(); ++i)
    add("prefix" + std::to_string(i), keys[i]);

  RequestExtras extras;
  extras.lora_id = 7;
  extras.cache_salt = "salt";
  extras.mm_items.push_back(
      {.hash = {0x1234, 0x5678}, .start = 10, .length = 12});
  keys.clear();
  plain.AppendPrefixKeys(tokens, 16, extras, &keys);
  for (size_t i = 0; i < keys.size(); ++i)
    add("extras" + std::to_string(i), keys[i]);

  const auto chunk = plain.ChunkKeys(std::span(tokens).first(40), 16);
  for (size_t i = 0; i < chunk.size(); ++i)
    add("chunk" + std::to_string(i), chunk[i]);
  return lines;
}

}  // namespace tierkv::testing

#endif  // TIERKV_TESTS_KEY_FIXTURES_H_
