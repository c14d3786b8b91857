#include "tierkv/kv_layout.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "tests/status_matchers.h"

namespace tierkv {
namespace {

KvLayout Llama3_8B() {
  return KvLayout{.num_layers = 32,
                  .num_kv_heads = 8,
                  .head_dim = 128,
                  .block_size = 16,
                  .dtype = DType::kBF16};
}

TEST(KvLayout, DTypeNamesAndSizes) {
  EXPECT_EQ(DTypeName(DType::kF32), "f32");
  EXPECT_EQ(DTypeName(DType::kF16), "f16");
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(7)), 0u);
}

TEST(KvLayout, ValidLayoutPasses) {
  EXPECT_THAT(Llama3_8B().Validate(), IsOk());
}

TEST(KvLayout, ValidationNamesTheBadField) {
  struct Case {
    KvLayout layout;
    std::string field;
  };
  KvLayout base = Llama3_8B();
  std::vector<Case> cases;
  cases.push_back({base, "num_layers"});
  cases.back().layout.num_layers = 0;
  cases.push_back({base, "num_kv_heads"});
  cases.back().layout.num_kv_heads = -1;
  cases.push_back({base, "head_dim"});
  cases.back().layout.head_dim = 0;
  cases.push_back({base, "block_size"});
  cases.back().layout.block_size = 0;
  cases.push_back({base, "dtype"});
  cases.back().layout.dtype = static_cast<DType>(9);
  for (const Case& c : cases) {
    Status status = c.layout.Validate();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(status.message().find(c.field), std::string::npos)
        << status.message();
  }
}

TEST(KvLayout, RejectsBlocksPastFourGiB) {
  KvLayout layout = Llama3_8B();
  layout.block_size = 1 << 20;  // 32 * 2 * 2^20 * 8 * 128 * 2 bytes: 128 GiB.
  Status status = layout.Validate();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("4 GiB"), std::string::npos);
  layout = KvLayout{.num_layers = 1 << 30,
                    .num_kv_heads = 1 << 30,
                    .head_dim = 1 << 30,
                    .block_size = 1 << 30,
                    .dtype = DType::kF32};  // Would overflow 64 bits.
  EXPECT_EQ(layout.Validate().code(), StatusCode::kInvalidArgument);
}

TEST(KvLayout, ToStringAndFingerprint) {
  EXPECT_EQ(Llama3_8B().ToString(),
            "layers=32 kv_heads=8 head_dim=128 block=16 dtype=bf16");
  EXPECT_EQ(Llama3_8B().Fingerprint(),
            "kv1:layers=32,kv_heads=8,head_dim=128,block=16,dtype=bf16");
}

TEST(KvLayout, FingerprintDiffersForAnyFieldChange) {
  std::vector<KvLayout> layouts(6, Llama3_8B());
  layouts[1].num_layers = 33;
  layouts[2].num_kv_heads = 4;
  layouts[3].head_dim = 64;
  layouts[4].block_size = 32;
  layouts[5].dtype = DType::kF16;
  std::set<std::string> fingerprints;
  for (const KvLayout& l : layouts) fingerprints.insert(l.Fingerprint());
  EXPECT_EQ(fingerprints.size(), layouts.size());
  for (size_t i = 1; i < layouts.size(); ++i) {
    EXPECT_FALSE(layouts[i] == layouts[0]);
  }
  EXPECT_EQ(Llama3_8B(), Llama3_8B());
  KvLayout f32 = Llama3_8B();
  f32.dtype = DType::kF32;
  EXPECT_NE(f32.Fingerprint(), layouts[5].Fingerprint());
}

TEST(KvLayout, BlockGeometry) {
  KvLayout l = Llama3_8B();
  EXPECT_EQ(l.ElementSize(), 2u);
  EXPECT_EQ(l.TokenStride(), 8u * 128 * 2);        // 2 KiB.
  EXPECT_EQ(l.PlaneBytes(), 16u * 2048);           // 32 KiB.
  EXPECT_EQ(l.BlockBytes(), 32u * 2 * 16 * 2048);  // 2 MiB.
  EXPECT_EQ(l.Offset(0, KvPlane::kKey, 0), 0u);
  EXPECT_EQ(l.Offset(0, KvPlane::kKey, 1), 2048u);
  EXPECT_EQ(l.Offset(0, KvPlane::kValue, 0), 32768u);
  EXPECT_EQ(l.Offset(1, KvPlane::kKey, 0), 65536u);
  EXPECT_EQ(l.Offset(31, KvPlane::kValue, 15),
            l.BlockBytes() - l.TokenStride());
}

TEST(KvLayout, OffsetsTileTheBlockExactly) {
  KvLayout l{.num_layers = 3,
             .num_kv_heads = 2,
             .head_dim = 5,
             .block_size = 4,
             .dtype = DType::kF32};
  ASSERT_THAT(l.Validate(), IsOk());
  std::vector<int> covered(l.BlockBytes(), 0);
  for (int32_t layer = 0; layer < l.num_layers; ++layer) {
    for (KvPlane plane : {KvPlane::kKey, KvPlane::kValue}) {
      for (int32_t t = 0; t < l.block_size; ++t) {
        size_t off = l.Offset(layer, plane, t);
        ASSERT_LE(off + l.TokenStride(), l.BlockBytes());
        for (size_t b = 0; b < l.TokenStride(); ++b) ++covered[off + b];
      }
    }
  }
  for (int c : covered) EXPECT_EQ(c, 1);
}

TEST(KvLayout, StoreFingerprintNamesTheModel) {
  // The unnamed model keeps the layout's own namespace: stores that never
  // named a model keep their keys and disk values.
  EXPECT_EQ(StoreFingerprint(Llama3_8B(), ""), Llama3_8B().Fingerprint());
  EXPECT_EQ(StoreFingerprint(Llama3_8B(), "org/m@rev"),
            "kv1:layers=32,kv_heads=8,head_dim=128,block=16,dtype=bf16,"
            "model=org/m@rev");
  std::set<std::string> fingerprints;
  for (const char* model : {"", "a", "b", "ab"}) {
    fingerprints.insert(StoreFingerprint(Llama3_8B(), model));
  }
  EXPECT_EQ(fingerprints.size(), 4u);
}

TEST(KvLayout, ModelNames) {
  EXPECT_THAT(ValidateModelName(""), IsOk());
  EXPECT_THAT(ValidateModelName("meta-llama/Llama-3.1-8B-Instruct@5206a32"),
              IsOk());
  EXPECT_THAT(ValidateModelName(std::string(kMaxModelNameBytes, 'm')), IsOk());
  EXPECT_EQ(ValidateModelName(std::string(kMaxModelNameBytes + 1, 'm')).code(),
            StatusCode::kInvalidArgument);
  for (const char* bad :
       {"two words", "tab\there", "new\nline", "caf\xc3\xa9", "org/m#rev"}) {
    EXPECT_EQ(ValidateModelName(bad).code(), StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_EQ(ModelDisplayName(""), "(unnamed)");
  EXPECT_EQ(ModelDisplayName("m"), "\"m\"");
}

}  // namespace
}  // namespace tierkv
