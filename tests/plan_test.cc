// AttentionPlan (rpa/plan.h) and the engines' page tables
// (rpa/engine_page_tables.h):
//  - plan + run equals the one-call path bit for bit on the same thread
//    count, for every layout, with sinks, LSE, windows, soft caps and run
//    scales, over many runs of one plan and across re-plans;
//  - a plan is safe after its caller rewrites and frees the metadata arrays
//    (under ASan in `make test`, a read of them would be reported);
//  - a rejected Plan leaves the previous plan; every message of Run and of
//    the CSR checks, with nothing written;
//  - FlashInfer's CSR and vLLM's metadata give JAX's result bit for bit;
//  - one plan run from many threads at once (ConcurrencyTest: under TSan).
// The messages shared with the one-call path are checked through a plan in
// tests/validate_test.cc.
#include "rpa/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "rpa/rpa.h"
#include "testing/synthetic_batch.h"

namespace rpa {
namespace {

using testing::BatchSpec;
using testing::CacheViews;
using testing::MakeSyntheticBatch;
using testing::SyntheticBatch;
using testing::ViewsOf;

constexpr uint8_t kSentinel = 0xA5;

PageTable TableOf(const SyntheticBatch& b) {
  return PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()};
}

// A batch's page table in FlashInfer's CSR form (the arrays it owns).
struct Csr {
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, kv_last_page_len;

  explicit Csr(const SyntheticBatch& b) {
    const int32_t n = b.num_seqs[0];
    const int64_t page_size = b.spec.page_size;
    qo_indptr.assign(b.cu_q_lens.begin(), b.cu_q_lens.begin() + n + 1);
    kv_indptr.push_back(0);
    for (int32_t i = 0; i < n; ++i) {
      const int64_t pages = (b.kv_lens[i] + page_size - 1) / page_size;
      for (int64_t c = 0; c < pages; ++c) {
        kv_indices.push_back(b.page_indices[i * b.pages_per_seq + c]);
      }
      kv_indptr.push_back(static_cast<int32_t>(kv_indices.size()));
      kv_last_page_len.push_back(
          pages == 0 ? 0 : static_cast<int32_t>(b.kv_lens[i] - (pages - 1) * page_size));
    }
  }
  CsrPageTable Table() const {
    const int64_t n = static_cast<int64_t>(kv_last_page_len.size());
    return CsrPageTable{TensorView(qo_indptr.data(), DType::kI32, {n + 1}),
                        TensorView(kv_indptr.data(), DType::kI32, {n + 1}),
                        TensorView(kv_indices.data(), DType::kI32,
                                   {static_cast<int64_t>(kv_indices.size())}),
                        TensorView(kv_last_page_len.data(), DType::kI32, {n})};
  }
};

// The outputs of one call: out and, when asked for, lse.
struct Result {
  std::vector<uint8_t> out;
  std::vector<float> lse;
  bool operator==(const Result& other) const {
    // Bit patterns: NaN rows must be NaN in both.
    return out == other.out && lse.size() == other.lse.size() &&
           (lse.empty() ||
            std::memcmp(lse.data(), other.lse.data(), lse.size() * sizeof(float)) == 0);
  }
};

// What varies between the cases of the bit-for-bit grid.
struct Variant {
  std::optional<KVLayout> layout;  // None: combined.
  bool sinks = false, lse = false;
  std::optional<double> k_scale;
};

struct Fixture {
  SyntheticBatch batch;
  CacheViews views;
  std::vector<float> sinks;

  explicit Fixture(SyntheticBatch b) : batch(std::move(b)), views(ViewsOf(batch.KvPages())) {
    for (int64_t h = 0; h < batch.spec.num_q_heads; ++h) sinks.push_back(0.25f * (h % 4) - 0.5f);
  }
  KVPages Split(KVLayout layout) const {
    return layout == KVLayout::kNHD ? KVPages{views.k_nhd, views.v_nhd, layout}
                                    : KVPages{views.k_hnd, views.v_hnd, layout};
  }
  AttentionShape Shape(const Variant& v) const {
    return v.layout ? ShapeOf(batch.Q(), Split(*v.layout)) : ShapeOf(batch.Q(), batch.KvPages());
  }
  // Fresh sentinel-filled outputs and the run's extras over them.
  RunExtras Extras(const Variant& v, Result& r) const {
    r.out.assign(batch.q.size(), kSentinel);
    RunExtras extras;
    if (v.sinks) extras.sinks = TensorView(sinks.data(), DType::kF32, {batch.spec.num_q_heads});
    if (v.lse) {
      r.lse.assign(static_cast<size_t>(batch.num_tokens * batch.spec.num_q_heads), 7.0f);
      extras.lse = MutableTensorView(r.lse.data(), DType::kF32,
                                     {batch.num_tokens, batch.spec.num_q_heads});
    }
    extras.k_scale = extras.v_scale = v.k_scale;
    return extras;
  }
  Result OneCall(const Variant& v, AttentionOptions options) const {
    Result r;
    const RunExtras extras = Extras(v, r);
    options.sinks = extras.sinks;
    options.lse = extras.lse;
    if (v.k_scale) options.k_scale = options.v_scale = v.k_scale;
    const SyntheticBatch& b = batch;
    if (v.layout) {
      RaggedPagedAttention(b.Q(), Split(*v.layout), TableOf(b), options, b.OutView(r.out));
    } else {
      RaggedPagedAttention(b.Q(), b.KvPages(), TableOf(b), options, b.OutView(r.out));
    }
    return r;
  }
  Result Run(const AttentionPlan& plan, const Variant& v) const {
    Result r;
    const RunExtras extras = Extras(v, r);
    const SyntheticBatch& b = batch;
    if (v.layout) {
      plan.Run(b.Q(), Split(*v.layout), b.OutView(r.out), extras);
    } else {
      plan.Run(b.Q(), b.KvPages(), b.OutView(r.out), extras);
    }
    return r;
  }
};

SyntheticBatch MixedBatch(uint64_t seed, DType kv_dtype = DType::kBF16) {
  return MakeSyntheticBatch(BatchSpec{
      .num_q_heads = 8,
      .num_kv_heads = 2,
      .head_dim = 40,
      .page_size = 8,
      .kv_dtype = kv_dtype,
      .sequences = {{1, 70}, {9, 9}, {1, 1}, {17, 60}, {0, 12}, {0, 0}, {1, 200}},
      .max_num_seqs = 8,
      .max_num_batched_tokens = 40,  // Padding rows.
      .seed = seed});
}

// ---- Plan + run equals the one-call path.

TEST(PlanRunTest, EqualsTheOneCallPathBitForBit) {
  std::mt19937_64 rng(11);
  const std::optional<KVLayout> layouts[] = {std::nullopt, KVLayout::kNHD, KVLayout::kHND};
  for (int i = 0; i < 12; ++i) {
    const Fixture f(MixedBatch(100 + i, i % 3 == 2 ? DType::kF8E4M3FN : DType::kBF16));
    AttentionOptions options;
    options.sm_scale = 0.15;
    options.num_threads = 1 + i % 4;
    if (i % 4 == 1) options.sliding_window = 1 + static_cast<int64_t>(rng() % 40);
    if (i % 5 == 2) options.soft_cap = 20.0;
    if (i % 3 == 2) options.k_scale = options.v_scale = 0.5;
    if (i % 6 == 5) options.num_kv_pages_per_block = 2;
    Variant v;
    v.layout = layouts[i % 3];
    v.sinks = i % 2 == 1;
    v.lse = i % 3 != 0;
    AttentionPlan plan;
    plan.Plan(f.Shape(v), TableOf(f.batch), options);
    const Result want = f.OneCall(v, options);
    // One plan, many runs ("layers"), each as the one call.
    for (int layer = 0; layer < 3; ++layer) {
      EXPECT_TRUE(f.Run(plan, v) == want) << "case " << i << " layer " << layer;
    }
    // A run's scales override the plan's, as options would.
    Variant scaled = v;
    scaled.k_scale = 0.75;
    EXPECT_TRUE(f.Run(plan, scaled) == f.OneCall(scaled, options)) << "case " << i;
    EXPECT_EQ(plan.num_threads(), *options.num_threads);
    EXPECT_EQ(plan.num_seqs(), 7);
  }
}

// The fused KV write on a plan: one plan, a run per "layer" (each its own
// cache and new rows), every cache and output bit-identical to the
// one-call RaggedPagedAttentionWithKVWrite; a run with a bad new_k throws
// the one-call message and writes nothing.
TEST(PlanRunTest, RunWithKVWriteEqualsTheOneCallWrite) {
  const SyntheticBatch b = MixedBatch(7);
  const int64_t kv_heads = 2, dim = 40;
  AttentionOptions options;
  options.sm_scale = 0.15;
  options.num_threads = 2;
  AttentionPlan plan;
  plan.Plan(ShapeOf(b.Q(), b.KvPages()), TableOf(b), options);
  const TensorView pages = b.KvPages();
  auto cache_view = [&](std::vector<uint8_t>& cache) {
    return MutableTensorView(cache.data(), pages.dtype,
                             {pages.shape[0], pages.shape[1], pages.shape[2], pages.shape[3]});
  };
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (int layer = 0; layer < 3; ++layer) {
    std::vector<float> new_k(static_cast<size_t>(b.num_tokens * kv_heads * dim));
    std::vector<float> new_v(new_k.size());
    for (float& x : new_k) x = normal(rng);
    for (float& x : new_v) x = normal(rng);
    const TensorView k_rows(new_k.data(), DType::kF32, {b.num_tokens, kv_heads, dim});
    const TensorView v_rows(new_v.data(), DType::kF32, {b.num_tokens, kv_heads, dim});
    std::vector<uint8_t> want_cache = b.kv_pages, got_cache = b.kv_pages;
    std::vector<uint8_t> want_out = b.NewOutput(), got_out = b.NewOutput();
    RaggedPagedAttentionWithKVWrite(b.Q(), k_rows, v_rows, cache_view(want_cache), TableOf(b),
                                    options, b.OutView(want_out));
    plan.RunWithKVWrite(b.Q(), k_rows, v_rows, cache_view(got_cache), b.OutView(got_out));
    EXPECT_EQ(got_cache, want_cache) << "layer " << layer;
    EXPECT_EQ(got_out, want_out) << "layer " << layer;
    EXPECT_NE(got_cache, b.kv_pages) << "layer " << layer << ": nothing written";

    const TensorView short_rows(new_k.data(), DType::kF32, {b.num_tokens - 1, kv_heads, dim});
    std::vector<uint8_t> untouched = b.kv_pages, out = b.NewOutput();
    const std::vector<uint8_t> out_before = out;
    try {
      plan.RunWithKVWrite(b.Q(), short_rows, v_rows, cache_view(untouched), b.OutView(out));
      ADD_FAILURE() << "expected rpa::Error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kShape);
      EXPECT_EQ(std::string(e.what()).rfind("new_k.shape=(39, 2, 40) must be (40, 2, 40)", 0), 0u)
          << e.what();
    }
    EXPECT_EQ(untouched, b.kv_pages);
    EXPECT_EQ(out, out_before);
  }
}

TEST(PlanRunTest, ReplansForTheNextStepAndMatchesOneCall) {
  AttentionPlan plan;
  AttentionOptions options;
  options.num_threads = 3;
  for (int step = 0; step < 4; ++step) {
    const Fixture f(MakeSyntheticBatch(BatchSpec{
        .num_q_heads = 4,
        .num_kv_heads = 4,
        .head_dim = 32,
        .page_size = 16,
        .sequences = {{step + 1, 30 + 50 * step}, {1, 5 + step}, {3, 3}},
        .seed = static_cast<uint64_t>(20 + step)}));
    plan.Plan(f.Shape({}), TableOf(f.batch), options);
    EXPECT_TRUE(f.Run(plan, {}) == f.OneCall({}, options)) << "step " << step;
  }
}

TEST(PlanRunTest, NumTokensFromThePageTable) {
  const Fixture f(MakeSyntheticBatch(BatchSpec{.num_q_heads = 2,
                                                .num_kv_heads = 1,
                                                .head_dim = 16,
                                                .page_size = 4,
                                                .q_dtype = DType::kF32,
                                                .kv_dtype = DType::kF32,
                                                .sequences = {{3, 9}, {1, 4}}}));
  AttentionShape shape = f.Shape({});
  shape.num_tokens = -1;
  AttentionPlan plan;
  plan.Plan(shape, TableOf(f.batch), {});
  EXPECT_EQ(plan.shape().num_tokens, 4);
  EXPECT_TRUE(f.Run(plan, {}) == f.OneCall({}, {}));
}

// The plan keeps its own copy of what it validated: a caller who rewrites
// its arrays with values that would read far out of bounds, then frees
// them, still gets the planned result (ASan reports any read of them).
TEST(PlanRunTest, SafeAfterTheCallerMutatesAndFreesItsMetadata) {
  const Fixture f(MixedBatch(3));
  const SyntheticBatch& b = f.batch;
  for (bool csr : {false, true}) {
    auto kv_lens = std::make_unique<std::vector<int32_t>>(b.kv_lens);
    auto pages = std::make_unique<std::vector<int32_t>>(b.page_indices);
    auto cu = std::make_unique<std::vector<int32_t>>(b.cu_q_lens);
    auto n = std::make_unique<std::vector<int32_t>>(b.num_seqs);
    auto table = std::make_unique<Csr>(b);
    AttentionPlan plan;
    if (csr) {
      plan.Plan(f.Shape({}), table->Table(), {});
    } else {
      plan.Plan(f.Shape({}),
                PageTable{TensorView(kv_lens->data(), DType::kI32, {b.KvLens().shape[0]}),
                          TensorView(pages->data(), DType::kI32,
                                     {b.PageIndices().shape[0], b.PageIndices().shape[1]}),
                          TensorView(cu->data(), DType::kI32, {b.CuQLens().shape[0]}),
                          TensorView(n->data(), DType::kI32, {1})},
                {});
    }
    const Result want = f.Run(plan, {});
    EXPECT_TRUE(want == f.OneCall({}, {}));
    for (auto* v : {kv_lens.get(), pages.get(), cu.get(), &table->kv_indices, &table->kv_indptr,
                    &table->qo_indptr, &table->kv_last_page_len}) {
      std::fill(v->begin(), v->end(), INT32_MAX);
    }
    (*n)[0] = INT32_MAX;
    EXPECT_TRUE(f.Run(plan, {}) == want) << (csr ? "CSR" : "JAX");
    kv_lens.reset();
    pages.reset();
    cu.reset();
    n.reset();
    table.reset();
    EXPECT_TRUE(f.Run(plan, {}) == want) << (csr ? "CSR" : "JAX");
  }
}

// ---- Errors: exact text, kind, nothing written, the plan as it was.

void ExpectError(const std::function<void()>& call, ErrorKind kind, const std::string& expected) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected: " << expected;
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), expected);
    EXPECT_EQ(ToString(e.kind()), ToString(kind));
  }
}

class PlanErrorTest : public ::testing::Test {
 protected:
  PlanErrorTest() : f_(Small()) {
    plan_.Plan(f_.Shape({}), TableOf(f_.batch), {});
    want_ = f_.Run(plan_, {});
  }
  static SyntheticBatch Small() {
    return MakeSyntheticBatch(BatchSpec{.num_q_heads = 4,
                                        .num_kv_heads = 2,
                                        .head_dim = 8,
                                        .page_size = 4,
                                        .q_dtype = DType::kF32,
                                        .kv_dtype = DType::kF32,
                                        .sequences = {{1, 5}, {3, 3}},
                                        .max_num_batched_tokens = 6});
  }
  // The call throws exactly `expected` without writing `out`, and the plan
  // still computes what it did.
  void ExpectRejected(const std::function<void(const MutableTensorView&)>& call, ErrorKind kind,
                      const std::string& expected) {
    std::vector<uint8_t> out(f_.batch.q.size(), kSentinel);
    ExpectError([&] { call(f_.batch.OutView(out)); }, kind, expected);
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint8_t x) { return x == kSentinel; }));
    EXPECT_TRUE(f_.Run(plan_, {}) == want_) << "the plan changed";
  }

  Fixture f_;
  AttentionPlan plan_;
  Result want_;
};

TEST_F(PlanErrorTest, RunBeforePlan) {
  ExpectRejected(
      [&](const MutableTensorView& out) {
        AttentionPlan().Run(f_.batch.Q(), f_.batch.KvPages(), out);
      },
      ErrorKind::kMetadata,
      "This AttentionPlan has no plan yet. Call Plan(shape, page_table, options) with the step's "
      "page table before Run.");
}

TEST_F(PlanErrorTest, RunQOfAnotherShape) {
  const TensorView q = f_.batch.Q();
  const TensorView short_q(q.data, q.dtype, {5, 4, 8});
  ExpectRejected([&](const MutableTensorView& out) { plan_.Run(short_q, f_.batch.KvPages(), out); },
                 ErrorKind::kShape,
                 "q.shape=(5, 4, 8) must be (6, 4, 8) as planned [max_num_batched_tokens, "
                 "num_q_heads, head_dim]. Run a plan on tensors of the shapes it was planned for "
                 "(AttentionShape), or plan again for these.");
}

TEST_F(PlanErrorTest, RunQOfAnotherDtype) {
  const TensorView q = f_.batch.Q();
  const TensorView half_q(q.data, DType::kF16, {6, 4, 8});
  ExpectRejected([&](const MutableTensorView& out) { plan_.Run(half_q, f_.batch.KvPages(), out); },
                 ErrorKind::kDtype,
                 "q.dtype=dtype('float16') must be the planned q_dtype=dtype('float32'). Run a "
                 "plan on tensors of the dtypes it was planned for, or plan again for these.");
}

TEST_F(PlanErrorTest, RunCacheOfAnotherShape) {
  const TensorView kv = f_.batch.KvPages();
  const TensorView fewer(kv.data, kv.dtype, {kv.shape[0] - 1, 4, 4, 8});
  ExpectRejected([&](const MutableTensorView& out) { plan_.Run(f_.batch.Q(), fewer, out); },
                 ErrorKind::kShape,
                 "kv_pages.shape=(" + std::to_string(kv.shape[0] - 1) +
                     ", 4, 4, 8) must be (" + std::to_string(kv.shape[0]) +
                     ", 4, 4, 8) as planned [total_num_pages, page_size, 2 * num_kv_heads, "
                     "head_dim]. Run a plan on tensors of the shapes it was planned for "
                     "(AttentionShape), or plan again for these.");
}

TEST_F(PlanErrorTest, RunCacheOfAnotherDtype) {
  const TensorView kv = f_.batch.KvPages();
  const TensorView as_f16(kv.data, DType::kF16, {kv.shape[0], 4, 4, 8});
  ExpectRejected([&](const MutableTensorView& out) { plan_.Run(f_.batch.Q(), as_f16, out); },
                 ErrorKind::kDtype,
                 "kv_pages.dtype=dtype('float16') must be the planned kv_dtype=dtype('float32'). "
                 "Run a plan on tensors of the dtypes it was planned for, or plan again for "
                 "these.");
}

TEST_F(PlanErrorTest, RunCacheOfAnotherLayout) {
  ExpectRejected(
      [&](const MutableTensorView& out) {
        plan_.Run(f_.batch.Q(), f_.Split(KVLayout::kNHD), out);
      },
      ErrorKind::kShape,
      "The cache is separate K and V caches in the NHD layout, but the plan is for JAX's "
      "combined kv_pages. Run a plan on a cache of the layout it was planned for "
      "(AttentionShape::kv_layout), or plan again for this one.");
}

TEST_F(PlanErrorTest, RunVPagesOfAnotherShape) {
  AttentionPlan split;
  split.Plan(f_.Shape(Variant{KVLayout::kHND, false, false, {}}), TableOf(f_.batch), {});
  KVPages kv = f_.Split(KVLayout::kHND);
  kv.v_pages.shape[2] = 3;
  ExpectRejected([&](const MutableTensorView& out) { split.Run(f_.batch.Q(), kv, out); },
                 ErrorKind::kShape,
                 "v_pages.shape=(" + std::to_string(kv.k_pages.shape[0]) +
                     ", 2, 3, 8) must be (" + std::to_string(kv.k_pages.shape[0]) +
                     ", 2, 4, 8) as planned [total_num_pages, num_kv_heads, page_size, "
                     "head_dim]. Run a plan on tensors of the shapes it was planned for "
                     "(AttentionShape), or plan again for these.");
}

TEST_F(PlanErrorTest, RunKScaleNotFinite) {
  RunExtras extras;
  extras.k_scale = INFINITY;
  ExpectRejected(
      [&](const MutableTensorView& out) {
        plan_.Run(f_.batch.Q(), f_.batch.KvPages(), out, extras);
      },
      ErrorKind::kOption,
      "k_scale=inf must be finite. Pass a finite float for k_scale, or None to leave it out.");
}

TEST_F(PlanErrorTest, PlanOptionsWithRunExtras) {
  std::vector<float> lse(24);
  AttentionOptions with_sinks, with_lse;
  with_sinks.sinks = TensorView(f_.sinks.data(), DType::kF32, {4});
  with_lse.lse = MutableTensorView(lse.data(), DType::kF32, {6, 4});
  for (const auto& [run_options, expected] :
       {std::pair{with_sinks,
                  "options.sinks belongs to each run, not to the plan. Pass sinks to "
                  "AttentionPlan::Run in RunExtras::sinks (each layer has its own)."},
        std::pair{with_lse,
                  "options.lse belongs to each run, not to the plan. Pass lse to "
                  "AttentionPlan::Run in RunExtras::lse (each layer writes its own)."}}) {
    ExpectRejected(
        // A copy: clang 14 cannot capture a structured binding.
        [&, options = run_options](const MutableTensorView&) {
          plan_.Plan(f_.Shape({}), TableOf(f_.batch), options);
        },
        ErrorKind::kOption, expected);
  }
}

TEST_F(PlanErrorTest, ShapeExtentBeyondInt32) {
  AttentionShape shape = f_.Shape({});
  shape.num_pages = int64_t{1} << 40;
  ExpectRejected([&](const MutableTensorView&) { plan_.Plan(shape, TableOf(f_.batch), {}); },
                 ErrorKind::kShape,
                 "num_pages=1099511627776 must fit in int32. An AttentionShape describes tensors "
                 "in memory: pass their extents (rpa::ShapeOf reads them from the views).");
}

TEST_F(PlanErrorTest, BadMetadataKeepsThePlan) {
  std::vector<int32_t> kv_lens = f_.batch.kv_lens;
  kv_lens[1] = -3;
  const PageTable bad{TensorView(kv_lens.data(), DType::kI32, {2}), f_.batch.PageIndices(),
                      f_.batch.CuQLens(), f_.batch.NumSeqs()};
  ExpectRejected([&](const MutableTensorView&) { plan_.Plan(f_.Shape({}), bad, {}); },
                 ErrorKind::kMetadata,
                 "kv_lens[1]=-3 must be greater or equal to 0. kv_lens holds each sequence's "
                 "number of tokens in the cache.");
}

TEST(WindowLeftTest, IsSlidingWindowMinusOne) {
  EXPECT_EQ(SlidingWindowFromWindowLeft(-1), std::nullopt);
  EXPECT_EQ(SlidingWindowFromWindowLeft(0), 1);
  EXPECT_EQ(SlidingWindowFromWindowLeft(127), 128);
  ExpectError([] { SlidingWindowFromWindowLeft(-2); }, ErrorKind::kOption,
              "window_left=-2 must be -1 (no window) or >= 0. FlashInfer's window_left counts "
              "the keys before the query's own position a row sees: sliding_window = "
              "window_left + 1.");
}

// ---- FlashInfer's CSR page table and vLLM's metadata.

TEST(CsrPageTableTest, EqualsTheJaxForm) {
  for (int i = 0; i < 6; ++i) {
    const Fixture f(MixedBatch(40 + i));
    const Csr csr(f.batch);
    AttentionOptions options;
    options.num_threads = 1 + i % 3;
    if (i % 2) options.sliding_window = 13;
    if (i % 3 == 1) options.num_kv_pages_per_block = 3;
    const Variant v{i % 3 == 2 ? std::optional<KVLayout>(KVLayout::kNHD) : std::nullopt, true,
                    true, {}};
    AttentionPlan jax, flashinfer;
    jax.Plan(f.Shape(v), TableOf(f.batch), options);
    flashinfer.Plan(f.Shape(v), csr.Table(), options);
    EXPECT_TRUE(f.Run(flashinfer, v) == f.Run(jax, v)) << "case " << i;
    EXPECT_EQ(flashinfer.block_sizes(), jax.block_sizes());
  }
}

TEST(VllmPageTableTest, EqualsTheJaxFormWithoutCopies) {
  const Fixture f(MixedBatch(9));
  const SyntheticBatch& b = f.batch;
  // vLLM's persistent buffers: more rows than this step's requests.
  const int64_t reqs = b.num_seqs[0], cols = b.pages_per_seq;
  std::vector<int32_t> block_table(static_cast<size_t>((reqs + 5) * cols), -1);
  std::copy(b.page_indices.begin(), b.page_indices.begin() + reqs * cols, block_table.begin());
  std::vector<int32_t> query_start_loc(b.cu_q_lens.begin(), b.cu_q_lens.begin() + reqs + 1);
  query_start_loc.resize(reqs + 6, 0);
  const std::vector<int32_t> seq_lens(b.kv_lens.begin(), b.kv_lens.begin() + reqs);
  const std::vector<int32_t> n = {static_cast<int32_t>(reqs)};
  const PageTable table = VllmPageTable(
      TensorView(query_start_loc.data(), DType::kI32, {reqs + 6}),
      TensorView(seq_lens.data(), DType::kI32, {reqs}),
      TensorView(block_table.data(), DType::kI32, {reqs + 5, cols}),
      TensorView(n.data(), DType::kI32, {1}));
  EXPECT_EQ(table.page_indices.data, block_table.data());
  EXPECT_EQ(table.page_indices.shape[0], reqs);
  EXPECT_EQ(table.cu_q_lens.shape[0], reqs + 1);
  const Result want = f.OneCall({}, {});
  AttentionPlan plan;
  plan.Plan(f.Shape({}), table, {});
  EXPECT_TRUE(f.Run(plan, {}) == want);
  std::vector<uint8_t> out = b.NewOutput();
  RaggedPagedAttention(b.Q(), b.KvPages(), table, {}, b.OutView(out));
  EXPECT_EQ(out, want.out);
}

// A valid CSR batch: page_size 4, 6 pages; sequence 0 (q 1, kv 5) on pages
// {4, 1}, sequence 1 (q 3, kv 3) on page {2}, sequence 2 empty; kv_indices
// has one unused entry; q has 8 rows (4 padding).
class CsrErrorTest : public ::testing::Test {
 protected:
  CsrErrorTest() {
    for (size_t i = 0; i < q_.size(); ++i) q_[i] = 0.01f * static_cast<float>(i % 17);
    for (size_t i = 0; i < kv_.size(); ++i) kv_[i] = 0.02f * static_cast<float>(i % 13);
    plan_.Plan(Shape(), Table(), {});
    want_ = RunPlan();
  }
  AttentionShape Shape() const {
    return AttentionShape{8, 4, 2, 8, 6, 4, DType::kF32, DType::kF32, std::nullopt};
  }
  CsrPageTable Table() const {
    return CsrPageTable{TensorView(qo_indptr_.data(), DType::kI32, {qo_entries_}),
                        TensorView(kv_indptr_.data(), DType::kI32, {3 + 1}),
                        TensorView(kv_indices_.data(), DType::kI32, {4}),
                        TensorView(last_page_len_.data(), DType::kI32, {3})};
  }
  std::vector<float> RunPlan() {
    std::vector<float> out(q_.size(), 7.0f);
    plan_.Run(TensorView(q_.data(), DType::kF32, {8, 4, 8}),
              TensorView(kv_.data(), DType::kF32, {6, 4, 4, 8}),
              MutableTensorView(out.data(), DType::kF32, {8, 4, 8}));
    return out;
  }
  // Planning the valid table after `edit` throws exactly `expected`.
  void ExpectEditRejected(const std::function<void(CsrPageTable&)>& edit, ErrorKind kind,
                          const std::string& expected) {
    CsrPageTable table = Table();
    edit(table);
    ExpectRejected(table, kind, expected, Shape());
  }
  // Planning `table` throws exactly `expected`, and the plan is as it was.
  void ExpectRejected(const CsrPageTable& table, ErrorKind kind, const std::string& expected,
                      const AttentionShape& shape, const AttentionOptions& options = {}) {
    ExpectError([&] { plan_.Plan(shape, table, options); }, kind, expected);
    EXPECT_EQ(RunPlan(), want_);
  }
  void ExpectRejected(ErrorKind kind, const std::string& expected) {
    ExpectRejected(Table(), kind, expected, Shape());
  }

  std::vector<float> q_ = std::vector<float>(8 * 4 * 8);
  std::vector<float> kv_ = std::vector<float>(6 * 4 * 4 * 8);
  std::vector<int32_t> qo_indptr_ = {0, 1, 4, 4};
  int64_t qo_entries_ = 4;
  std::vector<int32_t> kv_indptr_ = {0, 2, 3, 3};
  std::vector<int32_t> kv_indices_ = {4, 1, 2, -7};
  std::vector<int32_t> last_page_len_ = {1, 3, 0};
  std::vector<int64_t> wide_ = {4, 1, 2, 0};
  AttentionPlan plan_;
  std::vector<float> want_;
};

TEST_F(CsrErrorTest, AcceptsTheBatchLikeTheJaxForm) {
  std::vector<int32_t> kv_lens = {5, 3, 0}, pages = {4, 1, 2, 0, 0, 0}, cu = {0, 1, 4, 4},
                       n = {3};
  std::vector<float> out(q_.size(), 7.0f);
  RaggedPagedAttention(TensorView(q_.data(), DType::kF32, {8, 4, 8}),
                       TensorView(kv_.data(), DType::kF32, {6, 4, 4, 8}),
                       PageTable{TensorView(kv_lens.data(), DType::kI32, {3}),
                                 TensorView(pages.data(), DType::kI32, {3, 2}),
                                 TensorView(cu.data(), DType::kI32, {4}),
                                 TensorView(n.data(), DType::kI32, {1})},
                       {}, MutableTensorView(out.data(), DType::kF32, {8, 4, 8}));
  EXPECT_EQ(want_, out);
  EXPECT_EQ(plan_.num_seqs(), 3);
}

TEST_F(CsrErrorTest, QoIndptrRank2) {
  ExpectEditRejected(
      [&](CsrPageTable& t) {
        t.qo_indptr = TensorView(qo_indptr_.data(), DType::kI32, {2, 2});
      },
      ErrorKind::kShape,
      "qo_indptr.shape=(2, 2) must have 1 dimensions [batch_size + 1]. Pass qo_indptr "
      "as a 1-dimensional array [batch_size + 1].");
}

TEST_F(CsrErrorTest, QoIndptrEmpty) {
  ExpectEditRejected(
      [&](CsrPageTable& t) { t.qo_indptr.shape[0] = 0; }, ErrorKind::kShape,
      "qo_indptr.shape=(0,) must have at least one entry. qo_indptr has batch_size + "
      "1 entries, from qo_indptr[0] = 0; an empty batch is qo_indptr = [0].");
}

TEST_F(CsrErrorTest, KvIndptrShape) {
  ExpectEditRejected(
      [&](CsrPageTable& t) { t.kv_indptr.shape[0] = 3; }, ErrorKind::kShape,
      "kv_indptr.shape=(3,) must be the same as qo_indptr.shape=(4,). Give kv_indptr "
      "one entry per sequence plus one, like qo_indptr.");
}

TEST_F(CsrErrorTest, LastPageLenShape) {
  ExpectEditRejected(
      [&](CsrPageTable& t) { t.kv_last_page_len.shape[0] = 2; }, ErrorKind::kShape,
      "kv_last_page_len.shape=(2,) must be (batch_size=3,). Give kv_last_page_len one "
      "entry per sequence: qo_indptr.shape[0] - 1.");
}

TEST_F(CsrErrorTest, KvIndicesInt64) {
  ExpectEditRejected(
      [&](CsrPageTable& t) { t.kv_indices = TensorView(wide_.data(), DType::kI64, {4}); },
      ErrorKind::kDtype,
      "The dtype of `qo_indptr`, `kv_indptr`, `kv_indices` and `kv_last_page_len` "
      "must be int32. Got qo_indptr.dtype=dtype('int32'), "
      "kv_indptr.dtype=dtype('int32'), kv_indices.dtype=dtype('int64'), "
      "kv_last_page_len.dtype=dtype('int32'). Cast them to int32 (FlashInfer keeps "
      "them as torch.int32).");
}

TEST_F(CsrErrorTest, KvIndicesStrided) {
  ExpectEditRejected(
      [&](CsrPageTable& t) {
        t.kv_indices = TensorView(kv_indices_.data(), DType::kI32, {2}, {2});
      },
      ErrorKind::kLayout,
      "kv_indices must be contiguous in its last dimension; got "
      "kv_indices.strides=(2,) (in elements). Pass a view of kv_indices whose last "
      "stride is 1 (other strides are free), or a contiguous copy.");
}

TEST_F(CsrErrorTest, QoIndptrNotFromZero) {
  qo_indptr_[0] = 1;
  ExpectRejected(ErrorKind::kMetadata,
                 "qo_indptr[0]=1 must be 0. qo_indptr[i] is where sequence i's query rows start; "
                 "FlashInfer's indptr arrays start at 0.");
}

TEST_F(CsrErrorTest, QoIndptrDecreasing) {
  qo_indptr_ = {0, 4, 1, 4};
  ExpectRejected(ErrorKind::kMetadata,
                 "qo_indptr[2]=1 must be greater or equal to qo_indptr[1]=4. qo_indptr is the "
                 "running sum of the sequences' query rows: it never decreases.");
}

TEST_F(CsrErrorTest, KvIndptrNotFromZero) {
  kv_indptr_[0] = 1;
  ExpectRejected(ErrorKind::kMetadata,
                 "kv_indptr[0]=1 must be 0. kv_indptr[i] is where sequence i's pages start; "
                 "FlashInfer's indptr arrays start at 0.");
}

TEST_F(CsrErrorTest, KvIndptrDecreasing) {
  kv_indptr_ = {0, 2, 1, 3};
  ExpectRejected(ErrorKind::kMetadata,
                 "kv_indptr[2]=1 must be greater or equal to kv_indptr[1]=2. kv_indptr is the "
                 "running sum of the sequences' pages: it never decreases.");
}

TEST_F(CsrErrorTest, KvIndptrBeyondKvIndices) {
  kv_indptr_ = {0, 2, 3, 5};
  ExpectRejected(ErrorKind::kMetadata,
                 "kv_indptr[3]=5 must be less or equal to kv_indices.shape[0]=4. "
                 "kv_indptr[batch_size] counts the pages in use; kv_indices must hold them all.");
}

TEST_F(CsrErrorTest, LastPageLenZero) {
  last_page_len_[1] = 0;
  ExpectRejected(ErrorKind::kMetadata,
                 "kv_last_page_len[1]=0 must be in range [1, page_size=4] because sequence 1 has "
                 "1 pages (kv_indptr[1]=2, kv_indptr[2]=3). kv_last_page_len counts the tokens in "
                 "a sequence's last page: at least 1, at most page_size.");
}

TEST_F(CsrErrorTest, LastPageLenBeyondPageSize) {
  last_page_len_[0] = 5;
  ExpectRejected(ErrorKind::kMetadata,
                 "kv_last_page_len[0]=5 must be in range [1, page_size=4] because sequence 0 has "
                 "2 pages (kv_indptr[0]=0, kv_indptr[1]=2). kv_last_page_len counts the tokens in "
                 "a sequence's last page: at least 1, at most page_size.");
}

TEST_F(CsrErrorTest, LastPageLenOfASequenceWithoutPages) {
  last_page_len_[2] = 2;
  ExpectRejected(ErrorKind::kMetadata,
                 "kv_last_page_len[2]=2 must be 0 because sequence 2 has no pages (kv_indptr[2] = "
                 "kv_indptr[3] = 3). A sequence without pages has no keys; give it "
                 "kv_last_page_len 0, or its pages.");
}

TEST_F(CsrErrorTest, KvLenBeyondInt32) {
  AttentionShape shape = Shape();
  shape.page_size = int64_t{1} << 30;
  qo_indptr_ = {0, 1, 1, 1};
  kv_indptr_ = {0, 3, 3, 3};
  last_page_len_ = {1, 0, 0};
  ExpectRejected(Table(), ErrorKind::kMetadata,
                 "kv_len=2147483649 of sequence 0 (3 pages of page_size=1073741824) must fit in "
                 "int32. Shorten the sequence.",
                 shape);
}

TEST_F(CsrErrorTest, TotalQTokensBeyondQ) {
  AttentionShape shape = Shape();
  shape.num_tokens = 3;
  ExpectRejected(Table(), ErrorKind::kMetadata,
                 "Total q tokens 4 must be less or equal to max_num_batched_tokens=3. "
                 "qo_indptr[batch_size] counts the q rows in use; make q taller or the batch "
                 "smaller.",
                 shape);
}

TEST_F(CsrErrorTest, QLenBeyondKvLen) {
  last_page_len_[1] = 2;
  ExpectRejected(ErrorKind::kMetadata,
                 "q_len=3 must be less or equal to kv_len=2 at sequence 1. A sequence's new "
                 "tokens are part of its history: its pages hold them too.");
}

TEST_F(CsrErrorTest, PageIndexOutOfRange) {
  kv_indices_[1] = 6;
  ExpectRejected(ErrorKind::kPageIndex,
                 "kv_indices[1]=6 must be in range [0, num_pages=6) because sequence 0 reads it "
                 "(its pages are kv_indices[0:2]). Point every page of a sequence at a page of "
                 "the cache.");
}

TEST_F(CsrErrorTest, BlockSizeBeyondKvIndices) {
  AttentionOptions options;
  options.num_kv_pages_per_block = 5;
  ExpectRejected(Table(), ErrorKind::kBlockSize,
                 "num_kv_pages_per_block=5 must be in range (0, 4]. Pass None to let the library "
                 "choose, or at most pages_per_seq = kv_indices.shape[0] = 4; pages_per_seq "
                 "depends on page_size (ceil(max_model_len / page_size)), so a value tuned for "
                 "another page size will not fit.",
                 Shape(), options);
}

// ---- One plan, many threads.

TEST(ConcurrencyTest, OnePlanRunsFromManyThreadsAtOnce) {
  const Fixture f(MixedBatch(77));
  AttentionOptions options;
  options.num_threads = 2;
  const Variant combined{std::nullopt, true, true, {}};
  const Variant nhd{KVLayout::kNHD, false, true, 0.5};
  AttentionPlan plan_combined, plan_nhd;
  plan_combined.Plan(f.Shape(combined), TableOf(f.batch), options);
  plan_nhd.Plan(f.Shape(nhd), Csr(f.batch).Table(), options);
  const Result want_combined = f.Run(plan_combined, combined);
  const Result want_nhd = f.Run(plan_nhd, nhd);
  constexpr int kCallers = 6;
  constexpr int kIterations = 12;
  std::vector<int> mismatches(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int it = 0; it < kIterations; ++it) {
        if ((c + it) % 2 == 0) {
          if (!(f.Run(plan_combined, combined) == want_combined)) ++mismatches[c];
        } else if (!(f.Run(plan_nhd, nhd) == want_nhd)) {
          ++mismatches[c];
        }
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(mismatches[c], 0) << "caller " << c;
}

}  // namespace
}  // namespace rpa
