// Attention beyond causal (docs/contract.md §1.6): causal=false, against the
// reference and against an independent construction:
//  - causal=false over every layout, dtype, GQA and page size, with q_len
//    above, at and below kv_len, agrees with the reference; planned (JAX's
//    and FlashInfer's page tables) it equals the one call bit for bit;
//  - ALiBi (with causal, window, soft cap, causal=false) agrees with the
//    reference in every layout; a plan keeps its own copy of the slopes;
//  - a causal=false row equals the causal decode row of the same query over
//    the same keys (each row made its own one-token sequence);
//  - every new message, with nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
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
