// Attention beyond causal (docs/contract.md §1.6): causal=false, against the
// reference and against an independent construction:
//  - causal=false over every layout, dtype, GQA and page size, with q_len
//    above, at and below kv_len, agrees with the reference; planned (JAX's
//    and FlashInfer's page tables) it equals the one call bit for bit;
//  - ALiBi (with causal, window, soft cap, causal=false) agrees with the
//    reference in every layout; a plan keeps its own copy of the slopes;
//  - custom masks (flat and packed, FlashInfer's layouts): the causal rule
//    as a mask equals the causal call, a band the sliding window; random
//    masks (whole rows dropped, q_len > kv_len) with sinks, LSE, soft cap and
//    ALiBi agree with the reference; a plan keeps its own copy;
//  - a causal=false row equals the causal decode row of the same query over
//    the same keys (each row made its own one-token sequence);
//  - every new message, with nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <tuple>
#include <string>
#include <vector>

#include "rpa/rpa.h"
#include "testing/synthetic_batch.h"
#include "testing/tolerance.h"

namespace rpa {
namespace {

using testing::BatchSpec;
using testing::CacheViews;
using testing::MakeSyntheticBatch;
using testing::SequenceShape;
using testing::SyntheticBatch;
using testing::ViewsOf;

enum class Layout { kCombined, kNHD, kHND };
constexpr Layout kLayouts[] = {Layout::kCombined, Layout::kNHD, Layout::kHND};

const char* ToString(Layout layout) {
  return layout == Layout::kCombined ? "combined" : layout == Layout::kNHD ? "NHD" : "HND";
}

struct Case {
  int64_t page_size;
  int64_t gqa;  // num_q_heads / num_kv_heads.
  int64_t head_dim;
  DType q_dtype;
  DType kv_dtype;

  std::string Name() const {
    return "ps" + std::to_string(page_size) + "_gqa" + std::to_string(gqa) + "_d" +
           std::to_string(head_dim) + "_q_" + std::string(rpa::ToString(q_dtype)) + "_kv_" +
           std::string(rpa::ToString(kv_dtype));
  }
};

const Case kCases[] = {
    {1, 1, 64, DType::kF32, DType::kF32},        {3, 4, 80, DType::kBF16, DType::kBF16},
    {7, 8, 128, DType::kF16, DType::kF16},       {16, 4, 128, DType::kBF16, DType::kF8E4M3FN},
    {16, 1, 64, DType::kF32, DType::kF8E5M2},    {3, 8, 64, DType::kBF16, DType::kI8},
    {16, 8, 128, DType::kBF16, DType::kBF16},    {7, 2, 256, DType::kF32, DType::kBF16},
};

// Decode, q_len below, at and above kv_len, a query without keys and an
// empty sequence; long enough for split KV tasks and several tiles.
std::vector<SequenceShape> NonCausalSequences() {
  return {{1, 40}, {5, 37}, {9, 9}, {12, 5}, {3, 0}, {0, 0}, {40, 70}, {70, 20}};
}

SyntheticBatch MakeBatch(const Case& c, std::vector<SequenceShape> sequences, uint64_t seed) {
  BatchSpec spec;
  spec.num_kv_heads = c.gqa == 8 ? 1 : 2;
  spec.num_q_heads = spec.num_kv_heads * c.gqa;
  spec.head_dim = c.head_dim;
  spec.page_size = c.page_size;
  spec.q_dtype = c.q_dtype;
  spec.kv_dtype = c.kv_dtype;
  spec.sequences = std::move(sequences);
  spec.max_num_seqs = static_cast<int64_t>(spec.sequences.size()) + 1;  // An idle entry.
  int64_t total_q = 0;
  for (const SequenceShape& s : spec.sequences) total_q += s.q_len;
  spec.max_num_batched_tokens = total_q + 2;  // Padding rows.
  spec.seed = seed;
  return MakeSyntheticBatch(spec);
}

AttentionOptions BaseOptions(const SyntheticBatch& b) {
  AttentionOptions options;
  options.sm_scale = 1.0 / std::sqrt(static_cast<double>(b.spec.head_dim));
  if (b.spec.kv_dtype == DType::kF8E4M3FN || b.spec.kv_dtype == DType::kF8E5M2 ||
      b.spec.kv_dtype == DType::kI8) {
    options.k_scale = 0.5;
    options.v_scale = 1.5;
  }
  return options;
}

PageTable TableOf(const SyntheticBatch& b) {
  return PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()};
}

// One call (or the reference) on the batch's cache in `layout`.
std::vector<uint8_t> Attend(const SyntheticBatch& b, const PageTable& table,
                            const AttentionOptions& options, Layout layout, bool reference) {
  std::vector<uint8_t> out(b.q.size(), 0xEE);
  const CacheViews v = ViewsOf(b.KvPages());
  const MutableTensorView o = b.OutView(out);
  if (layout == Layout::kCombined) {
    reference ? RefRaggedPagedAttention(b.Q(), b.KvPages(), table, options, o)
              : RaggedPagedAttention(b.Q(), b.KvPages(), table, options, o);
  } else {
    const KVPages kv = layout == Layout::kNHD ? KVPages{v.k_nhd, v.v_nhd, KVLayout::kNHD}
                                              : KVPages{v.k_hnd, v.v_hnd, KVLayout::kHND};
    reference ? RefRaggedPagedAttention(b.Q(), kv, table, options, o)
              : RaggedPagedAttention(b.Q(), kv, table, options, o);
  }
  return out;
}

void ExpectClose(const SyntheticBatch& b, const std::vector<uint8_t>& got,
                 const std::vector<uint8_t>& want, const std::string& what) {
  const double ratio = testing::ToleranceRatio(b, got, want, testing::KvTolerance(b.spec.kv_dtype));
  EXPECT_LE(ratio, 1.0) << what;  // NaN fails too.
}

class NonCausalTest : public ::testing::TestWithParam<Case> {};

TEST_P(NonCausalTest, MatchesReferenceInEveryLayout) {
  const SyntheticBatch b = MakeBatch(GetParam(), NonCausalSequences(), 7);
  AttentionOptions options = BaseOptions(b);
  options.causal = false;
  const std::vector<uint8_t> want = Attend(b, TableOf(b), options, Layout::kCombined, true);
  for (Layout layout : kLayouts) {
    ExpectClose(b, Attend(b, TableOf(b), options, layout, false), want, ToString(layout));
    for (int threads : {1, 3}) {
      AttentionOptions threaded = options;
      threaded.num_threads = threads;
      ExpectClose(b, Attend(b, TableOf(b), threaded, layout, false), want,
                  std::string(ToString(layout)) + " threads " + std::to_string(threads));
    }
  }
}

// Row j of a causal=false sequence sees all kv_len keys, as the last row of
// a causal sequence does: each live row as its own one-token causal
// sequence over the same pages must give the same output.
TEST_P(NonCausalTest, RowIsTheCausalDecodeOfItsQuery) {
  const SyntheticBatch b = MakeBatch(GetParam(), NonCausalSequences(), 11);
  AttentionOptions options = BaseOptions(b);
  std::vector<int32_t> kv_lens, page_indices, cu_q_lens{0};
  for (int32_t i = 0; i < b.num_seqs[0]; ++i) {
    // A row without keys would be a causal decode of kv_len 0, which the
    // q_len rule rejects: it reads one key of sequence 0 instead, and its
    // expected output is set to 0 below.
    const int32_t from = b.kv_lens[i] == 0 ? 0 : i;
    for (int32_t t = b.cu_q_lens[i]; t < b.cu_q_lens[i + 1]; ++t) {
      kv_lens.push_back(std::max(b.kv_lens[i], 1));
      for (int64_t c = 0; c < b.pages_per_seq; ++c) {
        page_indices.push_back(b.page_indices[from * b.pages_per_seq + c]);
      }
      cu_q_lens.push_back(t + 1);
    }
  }
  const int64_t rows = static_cast<int64_t>(kv_lens.size());
  const std::vector<int32_t> num_seqs{static_cast<int32_t>(rows)};
  const PageTable decode{TensorView(kv_lens.data(), DType::kI32, {rows}),
                         TensorView(page_indices.data(), DType::kI32, {rows, b.pages_per_seq}),
                         TensorView(cu_q_lens.data(), DType::kI32, {rows + 1}),
                         TensorView(num_seqs.data(), DType::kI32, {1})};
  std::vector<uint8_t> want = Attend(b, decode, options, Layout::kCombined, false);
  // Undo the kv_len 0 -> 1 rows: their output is 0.
  const int64_t row_elems = b.spec.num_q_heads * b.spec.head_dim;
  for (int32_t i = 0; i < b.num_seqs[0]; ++i) {
    if (b.kv_lens[i] != 0) continue;
    for (int64_t e = b.cu_q_lens[i] * row_elems; e < b.cu_q_lens[i + 1] * row_elems; ++e) {
      StoreFromF32(b.spec.q_dtype, want.data(), e, 0.0f);
    }
  }
  options.causal = false;
  const std::vector<uint8_t> got = Attend(b, TableOf(b), options, Layout::kCombined, false);
  ExpectClose(b, got, want, "fast");
  ExpectClose(b, Attend(b, TableOf(b), options, Layout::kCombined, true), want, "reference");
}

// Planned from JAX's page table and from FlashInfer's CSR: the one call's
// bits (one thread count).
TEST_P(NonCausalTest, PlanEqualsOneCall) {
  const SyntheticBatch b = MakeBatch(GetParam(), NonCausalSequences(), 13);
  AttentionOptions options = BaseOptions(b);
  options.causal = false;
  options.num_threads = 2;
  const std::vector<uint8_t> want = Attend(b, TableOf(b), options, Layout::kNHD, false);
  const CacheViews v = ViewsOf(b.KvPages());
  const KVPages kv{v.k_nhd, v.v_nhd, KVLayout::kNHD};
  std::vector<int32_t> qo_indptr, kv_indptr{0}, kv_indices, last;
  qo_indptr.assign(b.cu_q_lens.begin(), b.cu_q_lens.begin() + b.num_seqs[0] + 1);
  for (int32_t i = 0; i < b.num_seqs[0]; ++i) {
    const int64_t pages = (b.kv_lens[i] + b.spec.page_size - 1) / b.spec.page_size;
    for (int64_t c = 0; c < pages; ++c) kv_indices.push_back(b.page_indices[i * b.pages_per_seq + c]);
    kv_indptr.push_back(static_cast<int32_t>(kv_indices.size()));
    last.push_back(pages == 0 ? 0
                              : static_cast<int32_t>(b.kv_lens[i] - (pages - 1) * b.spec.page_size));
  }
  const int64_t n = b.num_seqs[0];
  const CsrPageTable csr{
      TensorView(qo_indptr.data(), DType::kI32, {n + 1}),
      TensorView(kv_indptr.data(), DType::kI32, {n + 1}),
      TensorView(kv_indices.data(), DType::kI32, {static_cast<int64_t>(kv_indices.size())}),
      TensorView(last.data(), DType::kI32, {n})};
  for (bool use_csr : {false, true}) {
    AttentionPlan plan;
    AttentionShape shape = ShapeOf(b.Q(), kv);
    if (use_csr) {
      plan.Plan(shape, csr, options);
    } else {
      plan.Plan(shape, TableOf(b), options);
    }
    std::vector<uint8_t> out(b.q.size(), 0xEE);
    std::vector<uint8_t> got(want.size());
    plan.Run(b.Q(), kv, b.OutView(out));
    if (use_csr) {
      // FlashInfer's q has no padding rows: compare the live ones.
      const size_t live = static_cast<size_t>(b.TotalQTokens() * b.spec.num_q_heads *
                                              b.spec.head_dim) * SizeOf(b.spec.q_dtype);
      EXPECT_TRUE(std::equal(want.begin(), want.begin() + live, out.begin())) << "CSR";
    } else {
      EXPECT_TRUE(out == want) << "JAX";
    }
  }
}

// ALiBi slopes as BLOOM's: 2^(-8 (h + 1) / num_q_heads).
std::vector<float> AlibiSlopes(int64_t num_q_heads) {
  std::vector<float> slopes;
  for (int64_t h = 0; h < num_q_heads; ++h) {
    slopes.push_back(std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(num_q_heads)));
  }
  return slopes;
}

// Causal (plain, windowed, capped) and causal=false, every layout, against
// the reference; decode rows included (the fused tiles must step aside).
TEST_P(NonCausalTest, AlibiMatchesReference) {
  const SyntheticBatch causal_batch =
      MakeBatch(GetParam(), {{1, 40}, {5, 37}, {9, 9}, {1, 3}, {0, 0}, {40, 70}}, 17);
  const SyntheticBatch free_batch = MakeBatch(GetParam(), NonCausalSequences(), 19);
  const std::vector<float> slopes = AlibiSlopes(causal_batch.spec.num_q_heads);
  const TensorView slopes_view(slopes.data(), DType::kF32,
                               {static_cast<int64_t>(slopes.size())});
  for (int variant = 0; variant < 4; ++variant) {
    const SyntheticBatch& b = variant == 3 ? free_batch : causal_batch;
    AttentionOptions options = BaseOptions(b);
    options.alibi_slopes = slopes_view;
    if (variant == 1) options.sliding_window = 6;
    if (variant == 2) options.soft_cap = 3.0;
    if (variant == 3) options.causal = false;
    const std::vector<uint8_t> want = Attend(b, TableOf(b), options, Layout::kCombined, true);
    for (Layout layout : kLayouts) {
      ExpectClose(b, Attend(b, TableOf(b), options, layout, false), want,
                  std::string(ToString(layout)) + " variant " + std::to_string(variant));
    }
  }
}

// A plan keeps its own copy of the slopes.
TEST_P(NonCausalTest, AlibiPlanKeepsItsCopy) {
  const SyntheticBatch b = MakeBatch(GetParam(), {{1, 40}, {5, 37}}, 23);
  std::vector<float> slopes = AlibiSlopes(b.spec.num_q_heads);
  AttentionOptions options = BaseOptions(b);
  options.alibi_slopes =
      TensorView(slopes.data(), DType::kF32, {static_cast<int64_t>(slopes.size())});
  options.num_threads = 2;
  const std::vector<uint8_t> want = Attend(b, TableOf(b), options, Layout::kCombined, false);
  AttentionPlan plan;
  plan.Plan(ShapeOf(b.Q(), b.KvPages()), TableOf(b), options);
  std::fill(slopes.begin(), slopes.end(), NAN);
  std::vector<uint8_t> out(b.q.size(), 0xEE);
  plan.Run(b.Q(), b.KvPages(), b.OutView(out));
  EXPECT_TRUE(out == want);
}

// ---- Custom masks.

// A flat custom mask (one byte per key) from a rule keep(seq, row, key,
// q_len, kv_len), over the batch's live sequences.
template <typename Keep>
std::vector<uint8_t> FlatMask(const SyntheticBatch& b, Keep keep) {
  std::vector<uint8_t> mask;
  for (int32_t i = 0; i < b.num_seqs[0]; ++i) {
    const int64_t q_len = b.cu_q_lens[i + 1] - b.cu_q_lens[i], kv_len = b.kv_lens[i];
    for (int64_t r = 0; r < q_len; ++r) {
      for (int64_t t = 0; t < kv_len; ++t) mask.push_back(keep(i, r, t, q_len, kv_len) ? 1 : 0);
    }
  }
  return mask;
}

// FlashInfer's segment_packbits(..., bitorder="little"): each sequence's
// block from its own byte.
std::vector<uint8_t> PackMask(const SyntheticBatch& b, const std::vector<uint8_t>& flat) {
  std::vector<uint8_t> packed;
  size_t at = 0;
  for (int32_t i = 0; i < b.num_seqs[0]; ++i) {
    const size_t count = static_cast<size_t>(b.cu_q_lens[i + 1] - b.cu_q_lens[i]) *
                         static_cast<size_t>(b.kv_lens[i]);
    const size_t first = packed.size();
    packed.resize(first + (count + 7) / 8, 0);
    for (size_t k = 0; k < count; ++k) {
      if (flat[at + k]) packed[first + k / 8] |= static_cast<uint8_t>(1u << (k % 8));
    }
    at += count;
  }
  return packed;
}

TensorView MaskView(const std::vector<uint8_t>& mask) {
  return TensorView(mask.data(), DType::kU8, {static_cast<int64_t>(mask.size())});
}

bool CausalKeep(int32_t, int64_t r, int64_t t, int64_t q_len, int64_t kv_len) {
  return t <= kv_len - q_len + r;
}

// Causal sequences (q_len <= kv_len), long enough for whole kept, whole
// dropped and partial tiles, split tasks and decode rows.
std::vector<SequenceShape> MaskSequences() {
  return {{1, 40}, {5, 37}, {9, 9}, {16, 70}, {0, 0}, {3, 3}, {40, 70}};
}

// The causal rule as a mask is the causal call; a band is a sliding window.
TEST_P(NonCausalTest, CustomMaskEqualsCausalAndWindow) {
  const SyntheticBatch b = MakeBatch(GetParam(), MaskSequences(), 29);
  AttentionOptions causal = BaseOptions(b);
  const std::vector<uint8_t> want_causal = Attend(b, TableOf(b), causal, Layout::kCombined, true);
  AttentionOptions window = causal;
  window.sliding_window = 5;
  const std::vector<uint8_t> want_window = Attend(b, TableOf(b), window, Layout::kCombined, true);
  const std::vector<uint8_t> causal_mask = FlatMask(b, CausalKeep);
  const std::vector<uint8_t> band_mask =
      FlatMask(b, [](int32_t, int64_t r, int64_t t, int64_t q_len, int64_t kv_len) {
        const int64_t p = kv_len - q_len + r;
        return t <= p && t > p - 5;
      });
  for (Layout layout : kLayouts) {
    for (const auto& [mask, want, name] :
         {std::tuple{&causal_mask, &want_causal, "causal"}, {&band_mask, &want_window, "band"}}) {
      const std::vector<uint8_t> packed = PackMask(b, *mask);
      AttentionOptions flat = causal;
      flat.custom_mask = MaskView(*mask);
      AttentionOptions bits = causal;
      bits.packed_custom_mask = MaskView(packed);
      const std::string what = std::string(name) + " " + ToString(layout);
      const std::vector<uint8_t> got = Attend(b, TableOf(b), flat, layout, false);
      ExpectClose(b, got, *want, what + " flat");
      EXPECT_TRUE(Attend(b, TableOf(b), bits, layout, false) == got) << what << " packed";
      ExpectClose(b, Attend(b, TableOf(b), flat, layout, true), *want, what + " reference");
    }
  }
}

// Random masks (whole rows dropped included) with q_len above kv_len, with
// sinks, LSE, soft cap and ALiBi, against the reference; rows without a kept
// key are 0 with LSE -inf.
TEST_P(NonCausalTest, RandomCustomMaskMatchesReference) {
  const SyntheticBatch b = MakeBatch(GetParam(), NonCausalSequences(), 31);
  std::mt19937_64 rng(37);
  std::vector<int> dropped_rows;
  std::vector<uint8_t> mask;
  for (int32_t i = 0; i < b.num_seqs[0]; ++i) {
    const int64_t q_len = b.cu_q_lens[i + 1] - b.cu_q_lens[i], kv_len = b.kv_lens[i];
    for (int64_t r = 0; r < q_len; ++r) {
      const int kind = static_cast<int>(rng() % 4);  // Dense, sparse, none, a prefix.
      if (kind == 2 && kv_len > 0) dropped_rows.push_back(b.cu_q_lens[i] + static_cast<int>(r));
      for (int64_t t = 0; t < kv_len; ++t) {
        mask.push_back(kind == 0 ? rng() % 4 != 0 : kind == 1 ? rng() % 8 == 0
                       : kind == 2 ? 0 : t < kv_len / 2);
      }
    }
  }
  ASSERT_FALSE(dropped_rows.empty());
  const std::vector<float> slopes = AlibiSlopes(b.spec.num_q_heads);
  std::vector<float> sinks(static_cast<size_t>(b.spec.num_q_heads), 0.25f);
  for (int variant = 0; variant < 3; ++variant) {
    AttentionOptions options = BaseOptions(b);
    options.custom_mask = MaskView(mask);
    if (variant == 1) {
      options.soft_cap = 2.0;
      options.alibi_slopes = TensorView(slopes.data(), DType::kF32, {b.spec.num_q_heads});
    }
    if (variant == 2) options.sinks = TensorView(sinks.data(), DType::kF32, {b.spec.num_q_heads});
    std::vector<float> lse_want(static_cast<size_t>(b.num_tokens * b.spec.num_q_heads), 7.0f);
    std::vector<float> lse_got = lse_want;
    AttentionOptions ref_options = options;
    ref_options.lse = MutableTensorView(lse_want.data(), DType::kF32,
                                        {b.num_tokens, b.spec.num_q_heads});
    const std::vector<uint8_t> want = Attend(b, TableOf(b), ref_options, Layout::kCombined, true);
    for (Layout layout : kLayouts) {
      for (int threads : {1, 3}) {
        AttentionOptions run = options;
        run.num_threads = threads;
        run.lse = MutableTensorView(lse_got.data(), DType::kF32,
                                    {b.num_tokens, b.spec.num_q_heads});
        const std::string what = std::string(ToString(layout)) + " variant " +
                                 std::to_string(variant) + " threads " + std::to_string(threads);
        ExpectClose(b, Attend(b, TableOf(b), run, layout, false), want, what);
        for (size_t k = 0; k < lse_got.size(); ++k) {
          if (std::isinf(lse_want[k])) {
            EXPECT_EQ(lse_got[k], lse_want[k]) << what << " lse " << k;
          } else {
            EXPECT_NEAR(lse_got[k], lse_want[k], 1e-2) << what << " lse " << k;
          }
        }
      }
    }
    for (int row : dropped_rows) {
      for (int64_t h = 0; h < b.spec.num_q_heads; ++h) {
        EXPECT_EQ(lse_want[static_cast<size_t>(row * b.spec.num_q_heads + h)], -INFINITY);
        for (int64_t d = 0; d < b.spec.head_dim; ++d) {
          EXPECT_EQ(LoadAsF32(b.spec.q_dtype, want.data(),
                              (row * b.spec.num_q_heads + h) * b.spec.head_dim + d),
                    0.0f);
        }
      }
    }
  }
}

// A plan keeps its own packed copy: the caller's mask may change after Plan.
TEST_P(NonCausalTest, CustomMaskPlanKeepsItsCopy) {
  const SyntheticBatch b = MakeBatch(GetParam(), MaskSequences(), 41);
  std::vector<uint8_t> mask = FlatMask(b, CausalKeep);
  AttentionOptions options = BaseOptions(b);
  options.custom_mask = MaskView(mask);
  options.num_threads = 2;
  const std::vector<uint8_t> want = Attend(b, TableOf(b), options, Layout::kCombined, false);
  AttentionPlan plan;
  plan.Plan(ShapeOf(b.Q(), b.KvPages()), TableOf(b), options);
  std::fill(mask.begin(), mask.end(), 0);
  std::vector<uint8_t> out(b.q.size(), 0xEE);
  plan.Run(b.Q(), b.KvPages(), b.OutView(out));
  EXPECT_TRUE(out == want);
}

INSTANTIATE_TEST_SUITE_P(Masks, NonCausalTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           return param_info.param.Name();
                         });

// ---- Messages: exact first sentence, kind, nothing written.

void ExpectError(const std::function<void()>& call, ErrorKind kind, const std::string& first) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected: " << first;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.substr(0, first.size()), first) << what;
    EXPECT_EQ(rpa::ToString(e.kind()), rpa::ToString(kind));
  }
}

class MaskErrorTest : public ::testing::Test {
 protected:
  MaskErrorTest() : b_(MakeBatch(kCases[0], {{2, 5}, {4, 3}}, 3)) {}
  // The call on options; out must stay as it was.
  void Expect(const AttentionOptions& options, ErrorKind kind, const std::string& first) {
    std::vector<uint8_t> out(b_.q.size(), 0xEE);
    const std::vector<uint8_t> before = out;
    ExpectError([&] { RaggedPagedAttention(b_.Q(), b_.KvPages(), TableOf(b_), options,
                                           b_.OutView(out)); },
                kind, first);
    EXPECT_TRUE(out == before) << "written on error: " << first;
    AttentionPlan plan;
    ExpectError([&] { plan.Plan(ShapeOf(b_.Q(), b_.KvPages()), TableOf(b_), options); }, kind,
                first);
  }
  SyntheticBatch b_;
};

TEST_F(MaskErrorTest, SlidingWindowNeedsCausal) {
  AttentionOptions options;
  options.causal = false;
  options.sliding_window = 8;
  Expect(options, ErrorKind::kOption, "sliding_window=8 must be None when causal=False.");
}

TEST_F(MaskErrorTest, CausalKeepsTheQLenRule) {
  Expect(AttentionOptions{}, ErrorKind::kMetadata,
         "q_len=4 must be less or equal to kv_len=3 at sequence 1.");
  AttentionOptions explicit_causal;
  explicit_causal.causal = true;
  Expect(explicit_causal, ErrorKind::kMetadata,
         "q_len=4 must be less or equal to kv_len=3 at sequence 1.");
}

TEST_F(MaskErrorTest, AlibiSlopes) {
  const int64_t heads = b_.spec.num_q_heads;
  std::vector<float> slopes(static_cast<size_t>(heads) + 1, 0.5f);
  std::vector<double> wide(static_cast<size_t>(heads), 0.5);
  AttentionOptions options;
  options.alibi_slopes = TensorView(slopes.data(), DType::kF32, {heads + 1});
  Expect(options, ErrorKind::kShape,
         "alibi_slopes.shape=(" + std::to_string(heads + 1) + ",) must be (num_q_heads=" +
             std::to_string(heads) + ",). Pass one slope per q head, or None for no "
             "alibi_slopes.");
  options.alibi_slopes = TensorView(wide.data(), DType::kF64, {heads});
  Expect(options, ErrorKind::kDtype, "alibi_slopes.dtype=dtype('float64') must be float32.");
  slopes[1] = INFINITY;
  options.alibi_slopes = TensorView(slopes.data(), DType::kF32, {heads});
  Expect(options, ErrorKind::kOption, "alibi_slopes[1]=inf must be finite.");
}

TEST_F(MaskErrorTest, CustomMask) {
  // Sequences (2, 5) and (4, 3): 2 * 5 + 4 * 3 = 22 keys, 2 + 2 = 4 packed bytes.
  std::vector<uint8_t> flat(22, 1), packed(4, 0xFF), wrong(21, 1);
  std::vector<int32_t> ints(22, 1);
  AttentionOptions both;
  both.custom_mask = MaskView(flat);
  both.packed_custom_mask = MaskView(packed);
  Expect(both, ErrorKind::kOption,
         "custom_mask and packed_custom_mask are the same mask in two forms; pass one.");
  AttentionOptions options;
  options.custom_mask = MaskView(wrong);
  Expect(options, ErrorKind::kShape,
         "custom_mask.shape=(21,) must be (22,): the sum over the live sequences of "
         "q_len * kv_len.");
  options.custom_mask = std::nullopt;
  options.packed_custom_mask = TensorView(packed.data(), DType::kU8, {3});
  Expect(options, ErrorKind::kShape,
         "packed_custom_mask.shape=(3,) must be (4,): the sum over the live sequences of "
         "ceil(q_len * kv_len / 8).");
  options.packed_custom_mask = TensorView(packed.data(), DType::kU8, {2, 2});
  Expect(options, ErrorKind::kShape, "packed_custom_mask.shape=(2, 2) must have 1 dimension.");
  options.packed_custom_mask = std::nullopt;
  options.custom_mask = TensorView(ints.data(), DType::kI32, {22});
  Expect(options, ErrorKind::kDtype,
         "custom_mask.dtype=dtype('int32') must be uint8 (bool as bytes).");
  options.custom_mask = MaskView(flat);
  options.causal = true;
  Expect(options, ErrorKind::kOption,
         "causal=True and custom_mask are two masks; the custom mask replaces the causal one.");
  options.causal = std::nullopt;
  options.sliding_window = 4;
  Expect(options, ErrorKind::kOption, "sliding_window=4 must be None with custom_mask.");
  // An empty mask (null data) is a mask too: its size is checked, and it
  // is not taken for no mask (a fuzz finding: it made the call causal).
  options.sliding_window = std::nullopt;
  options.custom_mask = TensorView(nullptr, DType::kU8, {0});
  Expect(options, ErrorKind::kShape,
         "custom_mask.shape=(0,) must be (22,): the sum over the live sequences of "
         "q_len * kv_len.");
  options.custom_mask = MaskView(flat);
  // Accepted: a mask lifts the q_len <= kv_len rule, causal=false too.
  options.sliding_window = std::nullopt;
  for (std::optional<bool> causal : {std::optional<bool>(), std::optional<bool>(false)}) {
    options.causal = causal;
    std::vector<uint8_t> out(b_.q.size(), 0xEE);
    RaggedPagedAttention(b_.Q(), b_.KvPages(), TableOf(b_), options, b_.OutView(out));
  }
}

// The ragged fuzzer's finding: rows of sequences without keys and their
// mask of 0 keys (null data). The call is not causal, so q_len > kv_len is
// allowed, and each such row sees no key: output 0.
TEST(MaskTest, AnEmptyMaskOfKeylessSequencesIsAccepted) {
  const SyntheticBatch b = MakeBatch(kCases[0], {{1, 0}, {3, 0}}, 5);
  AttentionOptions options;
  options.custom_mask = TensorView(nullptr, DType::kU8, {0});
  std::vector<uint8_t> out(b.q.size(), 0xEE);
  RaggedPagedAttention(b.Q(), b.KvPages(), TableOf(b), options, b.OutView(out));
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint8_t x) { return x == 0; }));
}

// The fused write stores the new tokens at the last q_len positions: they
// must fit in kv_len even when the attention is not causal.
TEST_F(MaskErrorTest, KvWriteNeedsRoomForTheNewTokens) {
  AttentionOptions options;
  options.causal = false;
  std::vector<uint8_t> cache = b_.kv_pages;
  const std::vector<uint8_t> cache_before = cache;
  const TensorView kv = b_.KvPages();
  const MutableTensorView kv_out(cache.data(), kv.dtype,
                                 {kv.shape[0], kv.shape[1], kv.shape[2], kv.shape[3]});
  std::vector<float> rows(static_cast<size_t>(b_.num_tokens * b_.spec.num_kv_heads *
                                              b_.spec.head_dim), 1.0f);
  const TensorView new_rows(rows.data(), DType::kF32,
                            {b_.num_tokens, b_.spec.num_kv_heads, b_.spec.head_dim});
  std::vector<uint8_t> out(b_.q.size(), 0xEE);
  const std::vector<uint8_t> out_before = out;
  ExpectError([&] { RaggedPagedAttentionWithKVWrite(b_.Q(), new_rows, new_rows, kv_out,
                                                    TableOf(b_), options, b_.OutView(out)); },
              ErrorKind::kMetadata, "q_len=4 must be less or equal to kv_len=3 at sequence 1.");
  EXPECT_TRUE(cache == cache_before);
  EXPECT_TRUE(out == out_before);
}

}  // namespace
}  // namespace rpa
