// Attention sinks, LSE output, MergeStates and the fused KV-cache write,
// each against hand values or the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <random>
#include <vector>

#include "rpa/rpa.h"
#include "testing/synthetic_batch.h"
#include "testing/tolerance.h"

namespace rpa {
namespace {

using testing::BatchSpec;
using testing::MakeSyntheticBatch;
using testing::SyntheticBatch;

// A tiny f32 problem with explicit keys and values: one sequence of kv_len
// keys, its last q_len tokens as queries, one q head and one kv head,
// head_dim 2, page_size 1.
struct Tiny {
  std::vector<float> q;
  std::vector<float> kv;  // [kv_len, 1, 2, 2]
  std::vector<int32_t> kv_lens, page_indices, cu_q_lens, num_seqs{1};
  std::vector<float> out;

  Tiny(const std::vector<std::pair<float, float>>& keys_values, std::vector<float> queries)
      : q(std::move(queries)) {
    const int32_t kv_len = static_cast<int32_t>(keys_values.size());
    const int32_t q_len = static_cast<int32_t>(q.size() / 2);
    for (const auto& [key, value] : keys_values) kv.insert(kv.end(), {key, 0.0f, value, 0.0f});
    kv_lens = {kv_len};
    for (int32_t t = 0; t < kv_len; ++t) page_indices.push_back(t);
    cu_q_lens = {0, q_len};
    out.assign(q.size(), -7.0f);
  }
  TensorView Q() const { return TensorView(q.data(), DType::kF32, {static_cast<int64_t>(q.size() / 2), 1, 2}); }
  TensorView Kv() const { return TensorView(kv.data(), DType::kF32, {kv_lens[0], 1, 2, 2}); }
  TensorView KvLens() const { return TensorView(kv_lens.data(), DType::kI32, {1}); }
  TensorView Pages() const { return TensorView(page_indices.data(), DType::kI32, {1, kv_lens[0]}); }
  TensorView CuQLens() const { return TensorView(cu_q_lens.data(), DType::kI32, {2}); }
  TensorView NumSeqs() const { return TensorView(num_seqs.data(), DType::kI32, {1}); }
  MutableTensorView Out() { return MutableTensorView(out.data(), DType::kF32, {static_cast<int64_t>(out.size() / 2), 1, 2}); }

  void Run(const AttentionOptions& options, bool reference) {
    if (reference) {
      RefRaggedPagedAttention(Q(), Kv(), PageTable{KvLens(), Pages(), CuQLens(), NumSeqs()},
                              options, Out());
    } else {
      RaggedPagedAttention(Q(), Kv(), PageTable{KvLens(), Pages(), CuQLens(), NumSeqs()}, options,
                           Out());
    }
  }
};

class ExtrasPath : public ::testing::TestWithParam<bool> {};

TEST_P(ExtrasPath, SinkJoinsTheDenominatorOnly) {
  // One key with logit 2 and value 3; a sink logit of 1.
  Tiny tiny({{2.0f, 3.0f}}, {1.0f, 0.0f});
  const float sink = 1.0f;
  std::vector<float> lse(1, 0.0f);
  AttentionOptions options;
  options.sinks = TensorView(&sink, DType::kF32, {1});
  options.lse = MutableTensorView(lse.data(), DType::kF32, {1, 1});
  tiny.Run(options, GetParam());
  const double expected = 3.0 * std::exp(2.0) / (std::exp(2.0) + std::exp(1.0));
  EXPECT_NEAR(tiny.out[0], expected, 1e-6);
  EXPECT_NEAR(lse[0], 2.0f, 1e-6) << "the LSE excludes the sink";
}

TEST_P(ExtrasPath, NegativeInfiniteSinkIsNoSink) {
  Tiny with({{0.5f, 1.0f}, {-1.0f, 2.0f}, {2.0f, -3.0f}}, {1.0f, 0.0f});
  Tiny without = with;
  const float sink = -INFINITY;
  AttentionOptions options;
  without.Run(options, GetParam());
  options.sinks = TensorView(&sink, DType::kF32, {1});
  with.Run(options, GetParam());
  EXPECT_NEAR(with.out[0], without.out[0], 1e-6);
}

TEST_P(ExtrasPath, LseIsLogSumExpOfVisibleLogitsAndPaddingIsNegInf) {
  // Queries at positions 1 and 2 of three keys; a padding row after them.
  Tiny tiny({{0.5f, 1.0f}, {-1.0f, 2.0f}, {2.0f, -3.0f}}, {1.0f, 0.0f, 2.0f, 0.0f, 9.0f, 9.0f});
  tiny.cu_q_lens = {0, 2};
  std::vector<float> lse(3, 0.0f);
  AttentionOptions options;
  options.sm_scale = 0.5;
  options.lse = MutableTensorView(lse.data(), DType::kF32, {3, 1});
  tiny.Run(options, GetParam());
  // Row 0 (position 1) sees keys 0, 1: logits 0.25, -0.5.
  EXPECT_NEAR(lse[0], std::log(std::exp(0.25) + std::exp(-0.5)), 1e-6);
  // Row 1 (position 2) sees all: logits 0.5, -1, 2.
  EXPECT_NEAR(lse[1], std::log(std::exp(0.5) + std::exp(-1.0) + std::exp(2.0)), 1e-6);
  EXPECT_EQ(lse[2], -INFINITY);
  EXPECT_EQ(tiny.out[4], 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Paths, ExtrasPath, ::testing::Values(true, false),
                         [](const auto& test) { return test.param ? "Reference" : "Production"; });

// Dense K and V [num_tokens, num_kv_heads, head_dim], cut into a combined
// paged cache holding tokens [begin, end) of one sequence.
struct DenseSequence {
  int64_t kv_heads = 2;
  int64_t q_heads = 4;
  int64_t head_dim = 16;
  int64_t page_size = 5;
  int32_t length = 37;
  std::vector<float> k, v, q;

  DenseSequence() {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    k.resize(static_cast<size_t>(length * kv_heads * head_dim));
    v.resize(k.size());
    q.resize(static_cast<size_t>(q_heads * head_dim));
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    for (float& x : q) x = normal(rng);
  }

  // Attention of the one decode query over keys [begin, end), with its LSE.
  void Attend(int32_t begin, int32_t end, std::vector<float>& out, std::vector<float>& lse) const {
    const int32_t kv_len = end - begin;
    const int32_t pages = static_cast<int32_t>((kv_len + page_size - 1) / page_size);
    std::vector<float> cache(static_cast<size_t>(pages * page_size * 2 * kv_heads * head_dim), NAN);
    for (int32_t t = 0; t < kv_len; ++t) {
      for (int64_t h = 0; h < kv_heads; ++h) {
        for (int64_t d = 0; d < head_dim; ++d) {
          const int64_t src = ((begin + t) * kv_heads + h) * head_dim + d;
          const int64_t dst = (t * 2 * kv_heads + 2 * h) * head_dim + d;
          cache[dst] = k[src];
          cache[dst + head_dim] = v[src];
        }
      }
    }
    std::vector<int32_t> page_indices(static_cast<size_t>(pages));
    for (int32_t i = 0; i < pages; ++i) page_indices[i] = pages - 1 - i;  // Reversed order.
    // Reverse the pages themselves to match.
    std::vector<float> shuffled(cache.size());
    const size_t page_floats = static_cast<size_t>(page_size * 2 * kv_heads * head_dim);
    for (int32_t i = 0; i < pages; ++i) {
      std::memcpy(&shuffled[page_indices[i] * page_floats], &cache[i * page_floats],
                  page_floats * sizeof(float));
    }
    std::vector<int32_t> kv_lens{kv_len}, cu_q_lens{0, 1}, num_seqs{1};
    out.assign(q.size(), 0.0f);
    lse.assign(static_cast<size_t>(q_heads), 0.0f);
    AttentionOptions options;
    options.sm_scale = 0.25;
    options.lse = MutableTensorView(lse.data(), DType::kF32, {1, q_heads});
    RaggedPagedAttention(
        TensorView(q.data(), DType::kF32, {1, q_heads, head_dim}),
        TensorView(shuffled.data(), DType::kF32, {pages, page_size, 2 * kv_heads, head_dim}),
        PageTable{TensorView(kv_lens.data(), DType::kI32, {1}),
                  TensorView(page_indices.data(), DType::kI32, {1, pages}),
                  TensorView(cu_q_lens.data(), DType::kI32, {2}),
                  TensorView(num_seqs.data(), DType::kI32, {1})},
        options, MutableTensorView(out.data(), DType::kF32, {1, q_heads, head_dim}));
  }
};

// Also with FlashInfer's base-2 LSEs (lse_e * log2(e)): the same output and
// the base-2 LSE of the whole.
TEST(MergeStates, SplitAtAnyPointEqualsWhole) {
  const DenseSequence seq;
  std::vector<float> whole, whole_lse;
  seq.Attend(0, seq.length, whole, whole_lse);
  const int64_t heads = seq.q_heads;
  const int64_t dim = seq.head_dim;
  for (LseBase base : {LseBase::kE, LseBase::k2}) {
    const float unit = base == LseBase::k2 ? std::numbers::log2e_v<float> : 1.0f;
    for (int32_t split = 1; split < seq.length; ++split) {
      std::vector<float> a, lse_a, b, lse_b;
      seq.Attend(0, split, a, lse_a);
      seq.Attend(split, seq.length, b, lse_b);
      for (float& x : lse_a) x *= unit;
      for (float& x : lse_b) x *= unit;
      // In place into a / lse_a.
      MergeStates(TensorView(a.data(), DType::kF32, {1, heads, dim}),
                  TensorView(lse_a.data(), DType::kF32, {1, heads}),
                  TensorView(b.data(), DType::kF32, {1, heads, dim}),
                  TensorView(lse_b.data(), DType::kF32, {1, heads}),
                  MutableTensorView(a.data(), DType::kF32, {1, heads, dim}),
                  MutableTensorView(lse_a.data(), DType::kF32, {1, heads}), base);
      for (size_t i = 0; i < whole.size(); ++i) {
        ASSERT_NEAR(a[i], whole[i], 1e-5) << "split " << split << " element " << i;
      }
      for (int64_t h = 0; h < heads; ++h) {
        ASSERT_NEAR(lse_a[h], whole_lse[h] * unit, 1e-5) << "split " << split << " head " << h;
      }
    }
  }
}

TEST(MergeStates, BothSidesEmptyGiveZeroAndNegInf) {
  std::vector<float> a{1.0f, 2.0f}, b{3.0f, 4.0f}, out(2, 5.0f);
  std::vector<float> lse_a{-INFINITY}, lse_b{-INFINITY}, lse{0.0f};
  MergeStates(TensorView(a.data(), DType::kF32, {1, 1, 2}), TensorView(lse_a.data(), DType::kF32, {1, 1}),
              TensorView(b.data(), DType::kF32, {1, 1, 2}), TensorView(lse_b.data(), DType::kF32, {1, 1}),
              MutableTensorView(out.data(), DType::kF32, {1, 1, 2}),
              MutableTensorView(lse.data(), DType::kF32, {1, 1}));
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(lse[0], -INFINITY);
}

TEST(MergeStates, OneSideEmptyGivesTheOther) {
  std::vector<float> a{1.0f, 2.0f}, b{3.0f, 4.0f}, out(2);
  std::vector<float> lse_a{-INFINITY}, lse_b{0.75f}, lse{0.0f};
  MergeStates(TensorView(a.data(), DType::kF32, {1, 1, 2}), TensorView(lse_a.data(), DType::kF32, {1, 1}),
              TensorView(b.data(), DType::kF32, {1, 1, 2}), TensorView(lse_b.data(), DType::kF32, {1, 1}),
              MutableTensorView(out.data(), DType::kF32, {1, 1, 2}),
              MutableTensorView(lse.data(), DType::kF32, {1, 1}));
  EXPECT_EQ(out[0], 3.0f);
  EXPECT_EQ(out[1], 4.0f);
  EXPECT_EQ(lse[0], 0.75f);
}

// MergeStates over f32 states of one head of head_dim 2: out_a, lse_a, out and
// lse of `tokens` rows, out_b and lse_b of `b_tokens`. Expects rpa::Error of
// `kind` with exactly `message`, and out and lse untouched.
void ExpectMergeRejected(int64_t tokens, int64_t b_tokens, ErrorKind kind, const char* message) {
  std::vector<float> a(4), b(4), out(4, 5.0f), lse_a(2), lse_b(2), lse(2, 5.0f);
  try {
    MergeStates(TensorView(a.data(), DType::kF32, {tokens, 1, 2}), TensorView(lse_a.data(), DType::kF32, {tokens, 1}),
                TensorView(b.data(), DType::kF32, {b_tokens, 1, 2}), TensorView(lse_b.data(), DType::kF32, {b_tokens, 1}),
                MutableTensorView(out.data(), DType::kF32, {tokens, 1, 2}),
                MutableTensorView(lse.data(), DType::kF32, {tokens, 1}));
    ADD_FAILURE() << "expected rpa::Error: " << message;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind);
    EXPECT_STREQ(e.what(), message);
  }
  EXPECT_EQ(out, std::vector<float>(4, 5.0f));
  EXPECT_EQ(lse, std::vector<float>(2, 5.0f));
}

TEST(MergeStates, MismatchedShapesAreRejectedBeforeWriting) {
  ExpectMergeRejected(2, 1, ErrorKind::kShape,
                      "out_b.shape=(1, 1, 2) must be the same as out_a.shape=(2, 1, 2). Merge "
                      "states of the same rows and heads.");
}

// out_a and lse_a were checked only "like themselves" (CheckLike(out_a, ...,
// out_a)), which looked at nothing but their last stride; every other
// argument is checked against them. Each is now checked as a view of its
// own, as every entry point checks its arguments: extents first.
TEST(MergeStates, NegativeExtentIsRejectedBeforeWriting) {
  ExpectMergeRejected(-1, -1, ErrorKind::kShape,
                      "out_a.shape=(-1, 1, 2) must not have a negative dimension. Pass a valid "
                      "view of out_a.");
}

// The fused write against writing by hand and then attending.
class KVWrite : public ::testing::TestWithParam<DType> {};

TEST_P(KVWrite, WritesTheLastQLenPositionsThenAttends) {
  BatchSpec spec;
  spec.num_q_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 24;
  spec.page_size = 3;
  spec.q_dtype = DType::kF32;
  spec.kv_dtype = GetParam();
  spec.sequences = {{1, 7}, {4, 4}, {3, 11}, {0, 5}, {2, 2}};
  spec.max_num_batched_tokens = 13;  // Padding rows too.
  spec.nan_beyond_kv_len = false;
  const SyntheticBatch batch = MakeSyntheticBatch(spec);

  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const int64_t rows = batch.num_tokens;
  std::vector<float> new_k(static_cast<size_t>(rows * spec.num_kv_heads * spec.head_dim));
  std::vector<float> new_v(new_k.size());
  for (float& x : new_k) x = normal(rng);
  for (float& x : new_v) x = normal(rng);
  const float k_scale = 0.5f;
  const float v_scale = 2.0f;

  // By hand: position kv_len - q_len + j of sequence i takes row cu_q_lens[i] + j.
  std::vector<uint8_t> expected_cache = batch.kv_pages;
  const int64_t row_elems = 2 * spec.num_kv_heads * spec.head_dim;
  const int64_t pages_per_seq = batch.PageIndices().shape[1];
  for (size_t i = 0; i < spec.sequences.size(); ++i) {
    const auto [q_len, kv_len] = spec.sequences[i];
    for (int32_t j = 0; j < q_len; ++j) {
      const int32_t position = kv_len - q_len + j;
      const int32_t page = batch.page_indices[i * pages_per_seq + position / spec.page_size];
      const int64_t slot_base = (page * spec.page_size + position % spec.page_size) * row_elems;
      for (int64_t h = 0; h < spec.num_kv_heads; ++h) {
        for (int64_t d = 0; d < spec.head_dim; ++d) {
          const int64_t src = ((batch.cu_q_lens[i] + j) * spec.num_kv_heads + h) * spec.head_dim + d;
          StoreFromF32(spec.kv_dtype, expected_cache.data(), slot_base + 2 * h * spec.head_dim + d,
                       new_k[src] / k_scale);
          StoreFromF32(spec.kv_dtype, expected_cache.data(),
                       slot_base + (2 * h + 1) * spec.head_dim + d, new_v[src] / v_scale);
        }
      }
    }
  }

  AttentionOptions options;
  options.sm_scale = 0.2;
  options.k_scale = k_scale;
  options.v_scale = v_scale;
  std::vector<uint8_t> cache = batch.kv_pages;
  const TensorView new_k_view(new_k.data(), DType::kF32, {rows, spec.num_kv_heads, spec.head_dim});
  const TensorView new_v_view(new_v.data(), DType::kF32, {rows, spec.num_kv_heads, spec.head_dim});
  const TensorView kv_shape = batch.KvPages();
  MutableTensorView cache_view(cache.data(), spec.kv_dtype,
                               {kv_shape.shape[0], kv_shape.shape[1], kv_shape.shape[2], kv_shape.shape[3]});
  std::vector<uint8_t> out = batch.NewOutput();
  RaggedPagedAttentionWithKVWrite(
      batch.Q(), new_k_view, new_v_view, cache_view,
      PageTable{batch.KvLens(), batch.PageIndices(), batch.CuQLens(), batch.NumSeqs()}, options,
      batch.OutView(out));
  ASSERT_EQ(cache, expected_cache) << "written slots, or untouched ones, differ";

  std::vector<uint8_t> expected_out = batch.NewOutput();
  RefRaggedPagedAttention(
      batch.Q(), TensorView(cache_view),
      PageTable{batch.KvLens(), batch.PageIndices(), batch.CuQLens(), batch.NumSeqs()}, options,
      batch.OutView(expected_out));
  EXPECT_LE(testing::MaxAbsDifference(batch, out, expected_out),
            testing::KvTolerance(spec.kv_dtype));
}

TEST_P(KVWrite, BadPageIndexTouchesNothing) {
  BatchSpec spec;
  spec.num_q_heads = 2;
  spec.num_kv_heads = 1;
  spec.head_dim = 8;
  spec.page_size = 4;
  spec.q_dtype = DType::kF32;
  spec.kv_dtype = GetParam();
  spec.sequences = {{2, 6}, {1, 9}};
  SyntheticBatch batch = MakeSyntheticBatch(spec);
  const int64_t pages_per_seq = batch.PageIndices().shape[1];
  batch.page_indices[1 * pages_per_seq + 2] = static_cast<int32_t>(batch.total_num_pages);  // Read by seq 1.

  std::vector<float> new_rows(static_cast<size_t>(batch.num_tokens * 8), 1.0f);
  const TensorView new_view(new_rows.data(), DType::kF32, {batch.num_tokens, 1, 8});
  std::vector<uint8_t> cache = batch.kv_pages;
  const TensorView kv_shape = batch.KvPages();
  MutableTensorView cache_view(cache.data(), spec.kv_dtype,
                               {kv_shape.shape[0], kv_shape.shape[1], kv_shape.shape[2], kv_shape.shape[3]});
  std::vector<uint8_t> out(batch.q.size(), 0xAB);
  EXPECT_THROW(RaggedPagedAttentionWithKVWrite(
                   batch.Q(), new_view, new_view, cache_view,
                   PageTable{batch.KvLens(), batch.PageIndices(), batch.CuQLens(), batch.NumSeqs()},
                   AttentionOptions{}, batch.OutView(out)),
               Error);
  EXPECT_EQ(cache, batch.kv_pages);
  EXPECT_EQ(out, std::vector<uint8_t>(batch.q.size(), 0xAB));

  // A new_k of the wrong shape: also rejected before any write.
  const TensorView short_view(new_rows.data(), DType::kF32, {batch.num_tokens - 1, 1, 8});
  batch.page_indices[1 * pages_per_seq + 2] = 0;
  try {
    RaggedPagedAttentionWithKVWrite(
        batch.Q(), short_view, new_view, cache_view,
        PageTable{batch.KvLens(), batch.PageIndices(), batch.CuQLens(), batch.NumSeqs()},
        AttentionOptions{}, batch.OutView(out));
    FAIL() << "expected rpa::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kShape);
    EXPECT_EQ(std::string(e.what()),
              "new_k.shape=(2, 1, 8) must be (3, 1, 8) = (max_num_batched_tokens, num_kv_heads, "
              "head_dim). Row r of new_k belongs to q row r: give it q's rows, the cache's kv heads "
              "and head_dim.");
  }
  EXPECT_EQ(cache, batch.kv_pages);
  EXPECT_EQ(out, std::vector<uint8_t>(batch.q.size(), 0xAB));
}

INSTANTIATE_TEST_SUITE_P(CacheDtypes, KVWrite,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF8E4M3FN,
                                           DType::kF8E5M2, DType::kI8),
                         [](const auto& test) { return std::string(ToString(test.param)); });

}  // namespace
}  // namespace rpa
