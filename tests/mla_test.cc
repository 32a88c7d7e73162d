// MLA (rpa/mla.h) against the float64 reference (testing/mla_batch.h):
//  - a randomized grid: heads 1..128, kv lens 0..5000, page sizes 1..128,
//    ragged decode and chunked prefill, causal on and off, every q and
//    latent dtype, both cache forms (two arrays, vLLM's combined one
//    sliced), threads 1..4, on the kernel dispatch picks and on the portable
//    one (ScopedCpuFeatureMask), NaN in every slot no sequence reads;
//  - split-KV (few long sequences on 4 threads) and the LSE: two halves of
//    the keys merged (rpa::MergeStates) give the whole;
//  - a plan reused after the caller rewrote and freed its metadata, many
//    runs of one plan, and no allocation in a warm plan or run;
//  - every message of Plan and Run, with nothing written.
#include "rpa/mla.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernel/cpu_features.h"
#include "rpa/merge.h"
#include "testing/amx_emulation.h"
#include "testing/mla_batch.h"
#include "testing/tolerance.h"
#include "testing/without_amx.h"

// Counts every allocation of the process, so a warm run can be shown to
// allocate nothing. Not under a sanitizer (which owns operator new).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RPA_MLA_COUNT_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define RPA_MLA_COUNT_ALLOCATIONS 0
#endif
#endif
#ifndef RPA_MLA_COUNT_ALLOCATIONS
#define RPA_MLA_COUNT_ALLOCATIONS 1
#endif

#if RPA_MLA_COUNT_ALLOCATIONS
namespace {
std::atomic<int64_t> g_allocations{0};
void* Allocate(size_t size, size_t align) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  void* p = align <= alignof(std::max_align_t)
                ? std::malloc(size == 0 ? 1 : size)
                : std::aligned_alloc(align, (size + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace
void* operator new(size_t size) { return Allocate(size, 0); }
void* operator new[](size_t size) { return Allocate(size, 0); }
void* operator new(size_t size, std::align_val_t a) { return Allocate(size, static_cast<size_t>(a)); }
void* operator new[](size_t size, std::align_val_t a) {
  return Allocate(size, static_cast<size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }
#endif

namespace rpa {
namespace {

using testing::MakeMlaBatch;
using testing::MlaBatch;
using testing::MlaBatchSpec;
using testing::MlaReference;
using testing::MlaReferenceResult;
using testing::MlaSequence;

struct RunResult {
  std::vector<uint8_t> out;
  std::vector<float> lse;
};

MlaOptions OptionsFor(const MlaBatch& b, bool causal, int threads) {
  MlaOptions o;
  o.causal = causal;
  o.sm_scale = 1.0 / std::sqrt(static_cast<double>(b.spec.head_dim_ckv + b.spec.head_dim_kpe));
  o.num_threads = threads;
  return o;
}

RunResult RunPlanned(const MlaPlan& plan, const MlaBatch& b, double kv_scale = 1.0) {
  RunResult r;
  r.out = b.NewOutput();
  r.lse.assign(static_cast<size_t>(b.num_tokens * b.spec.num_heads), 0.0f);
  MlaRunExtras extras;
  extras.lse = MutableTensorView(r.lse.data(), DType::kF32, {b.num_tokens, b.spec.num_heads});
  extras.kv_scale = kv_scale;
  plan.Run(b.QNope(), b.QPe(), b.CkvCache(), b.KpeCache(), b.OutView(r.out), extras);
  return r;
}

// Every output element within the contract's tolerance of the reference
// (f32 latents: the f32 bound at sm_scale = dim^-0.5), the LSE within 1e-3.
void ExpectNear(const MlaBatch& b, const RunResult& got, const MlaReferenceResult& want,
                const std::string& label) {
  const DType q = b.spec.q_dtype;
  int failures = 0;
  for (size_t i = 0; i < want.out.size() && failures < 5; ++i) {
    const double value = LoadAsF32(q, got.out.data(), static_cast<int64_t>(i));
    const double bound = testing::Tolerance(q, b.spec.kv_dtype, want.out[i]);
    if (!(std::fabs(value - want.out[i]) <= bound)) {
      ADD_FAILURE() << label << ": out[" << i << "] = " << value << ", reference "
                    << want.out[i] << " (bound " << bound << ")";
      ++failures;
    }
  }
  for (size_t i = 0; i < want.lse.size() && failures < 5; ++i) {
    const double ok = std::isinf(want.lse[i]) ? got.lse[i] == want.lse[i]
                                              : std::fabs(got.lse[i] - want.lse[i]) <= 1e-3;
    if (!ok) {
      ADD_FAILURE() << label << ": lse[" << i << "] = " << got.lse[i] << ", reference "
                    << want.lse[i];
      ++failures;
    }
  }
}

struct GridCase {
  MlaBatchSpec spec;
  bool causal;
  int threads;
};

std::string Describe(const GridCase& c) {
  std::ostringstream s;
  s << "heads=" << c.spec.num_heads << " ckv=" << c.spec.head_dim_ckv
    << " kpe=" << c.spec.head_dim_kpe << " page_size=" << c.spec.page_size
    << " q=" << ToString(c.spec.q_dtype) << " kv=" << ToString(c.spec.kv_dtype)
    << (c.spec.combined_cache ? " combined" : " split") << (c.causal ? " causal" : " non-causal")
    << " threads=" << c.threads << " seqs=";
  for (const MlaSequence& q : c.spec.sequences) s << "(" << q.q_len << "," << q.kv_len << ")";
  return s.str();
}

// The grid: random cases whose reference work stays small (most with
// narrow latents; DeepSeek's 512 + 64 with a few heads or keys).
std::vector<GridCase> Grid() {
  std::mt19937 rng(2024);
  auto pick = [&](std::initializer_list<int64_t> values) {
    return values.begin()[std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng)];
  };
  const DType q_dtypes[] = {DType::kBF16, DType::kBF16, DType::kF16, DType::kF32};
  const DType kv_dtypes[] = {DType::kBF16, DType::kF8E4M3FN, DType::kF16, DType::kF32};
  std::vector<GridCase> cases;
  for (int i = 0; i < 24; ++i) {
    GridCase c;
    const bool wide = i % 4 == 0;  // DeepSeek's latent widths.
    c.spec.head_dim_ckv = wide ? 512 : pick({16, 32, 48, 64});
    c.spec.head_dim_kpe = wide ? 64 : pick({16, 32});
    c.spec.num_heads = wide ? pick({1, 3, 16}) : pick({1, 2, 5, 16, 17, 40, 64, 128});
    c.spec.page_size = pick({1, 3, 7, 16, 64, 128});
    c.spec.q_dtype = q_dtypes[i % 4];
    c.spec.kv_dtype = c.spec.q_dtype == DType::kBF16 ? kv_dtypes[(i / 4) % 4]
                                                     : kv_dtypes[(i / 2) % 4];
    c.spec.combined_cache = i % 3 == 1;
    c.spec.seed = 100 + i;
    c.causal = i % 2 == 0;
    c.threads = 1 + i % 4;
    const int64_t max_keys = 4 * 5000 * 48 / ((c.spec.head_dim_ckv + c.spec.head_dim_kpe) *
                                              std::max<int64_t>(c.spec.num_heads / 4, 1));
    const int seqs = static_cast<int>(pick({1, 2, 3, 7}));
    for (int s = 0; s < seqs; ++s) {
      MlaSequence q;
      q.kv_len = std::uniform_int_distribution<int64_t>(0, std::min<int64_t>(5000, max_keys))(rng);
      q.q_len = s % 2 == 1 ? std::min<int64_t>(q.kv_len, pick({2, 5, 33})) : std::min<int64_t>(q.kv_len, 1);
      c.spec.sequences.push_back(q);
    }
    cases.push_back(c);
  }
  return cases;
}

TEST(MlaTest, MatchesTheFloat64ReferenceOverTheGrid) {
  for (const GridCase& c : Grid()) {
    const MlaBatch b = MakeMlaBatch(c.spec);
    const MlaOptions options = OptionsFor(b, c.causal, c.threads);
    const MlaReferenceResult want = MlaReference(b, c.causal, options.sm_scale, 1.0);
    MlaPlan plan;
    plan.Plan(b.Shape(), b.PageTable(), options);
    ExpectNear(b, RunPlanned(plan, b), want, Describe(c) + " [" + plan.DescribeKernels() + "]");
    if (internal::DetectedCpuFeatures().avx512bf16) {
      // AMD's rules (the bf16-pair kernel for bf16 q) on any CPU with
      // AVX-512 BF16, AMX hidden.
      const internal::ScopedCpuRules zen5(internal::CpuRules::kZen5);
      const testing::ScopedWithoutAmx hide_amx;
      MlaPlan pairs;
      pairs.Plan(b.Shape(), b.PageTable(), options);
      ExpectNear(b, RunPlanned(pairs, b), want,
                 Describe(c) + " [AMD's rules: " + pairs.DescribeKernels() + "]");
    }
    const bool amx_dtypes =
        c.spec.q_dtype == DType::kBF16 &&
        (c.spec.kv_dtype == DType::kBF16 || c.spec.kv_dtype == DType::kF8E4M3FN);
    if (amx_dtypes && internal::DetectedCpuFeatures().avx512bf16) {
      // mla_amx on the scalar tile model, wherever AVX-512 BF16 is.
      const testing::ScopedAmxEmulation emulate;
      MlaPlan amx;
      amx.Plan(b.Shape(), b.PageTable(), options);
      EXPECT_EQ(amx.DescribeKernels().rfind("mla_amx (emulated)", 0), 0u) << amx.DescribeKernels();
      ExpectNear(b, RunPlanned(amx, b), want,
                 Describe(c) + " [" + amx.DescribeKernels() + "]");
    }
    // The portable kernel on the same case.
    const internal::ScopedCpuFeatureMask portable(internal::kNoCpuFeatures);
    MlaPlan fallback;
    fallback.Plan(b.Shape(), b.PageTable(), options);
    EXPECT_NE(fallback.DescribeKernels().find("mla_highway_f32"), std::string::npos);
    ExpectNear(b, RunPlanned(fallback, b), want, Describe(c) + " [portable]");
  }
}

MlaBatchSpec DeepSeekDecode(int64_t heads, DType kv_dtype) {
  MlaBatchSpec spec;
  spec.num_heads = heads;
  spec.kv_dtype = kv_dtype;
  spec.sequences = {{1, 1500}, {1, 700}};
  return spec;
}

// bf16 q over bf16 latents: AMX's tiles where the CPU has them, else the
// bf16-pair kernel where vdpbf16ps is fast, else the portable one.
TEST(MlaTest, DispatchesTheBf16KernelsWhereTheyAreFast) {
  const MlaBatch b = MakeMlaBatch(DeepSeekDecode(16, DType::kBF16));
  MlaPlan plan;
  plan.Plan(b.Shape(), b.PageTable(), OptionsFor(b, true, 1));
  const internal::CpuFeatures& cpu = internal::UsableCpuFeatures();
  const std::string expected = cpu.amx_bf16                        ? "mla_amx"
                               : cpu.avx512bf16 && cpu.fast_bf16_dot ? "mla_avx512_bf16_pairs"
                                                                    : "mla_highway_f32";
  EXPECT_EQ(plan.DescribeKernels().rfind(expected, 0), 0u) << plan.DescribeKernels();
  // f16 latents are exact in f32, not in bf16: the portable kernel.
  MlaBatchSpec f16 = DeepSeekDecode(16, DType::kF16);
  const MlaBatch h = MakeMlaBatch(f16);
  plan.Plan(h.Shape(), h.PageTable(), OptionsFor(h, true, 1));
  EXPECT_EQ(plan.DescribeKernels().rfind("mla_highway_f32", 0), 0u) << plan.DescribeKernels();
}

TEST(MlaTest, Fp8LatentsWithAScale) {
  const MlaBatch b = MakeMlaBatch(DeepSeekDecode(16, DType::kF8E4M3FN));
  const MlaOptions options = OptionsFor(b, true, 2);
  const MlaReferenceResult want = MlaReference(b, true, options.sm_scale, 0.25);
  MlaPlan plan;
  plan.Plan(b.Shape(), b.PageTable(), options);
  ExpectNear(b, RunPlanned(plan, b, 0.25), want, "fp8 kv_scale=0.25");
}

// Few long sequences on 4 threads: the keys are split and merged.
TEST(MlaTest, SplitKvForFewLongSequences) {
  MlaBatchSpec spec = DeepSeekDecode(16, DType::kBF16);
  spec.sequences = {{1, 4100}};
  const MlaBatch b = MakeMlaBatch(spec);
  const MlaOptions options = OptionsFor(b, true, 4);
  MlaPlan plan;
  plan.Plan(b.Shape(), b.PageTable(), options);
  EXPECT_EQ(plan.DescribeKernels().find("0 split"), std::string::npos) << plan.DescribeKernels();
  ExpectNear(b, RunPlanned(plan, b), MlaReference(b, true, options.sm_scale, 1.0), "split");
}

// The keys of each sequence in two halves (two page tables over one cache),
// merged by their LSEs, give the whole.
TEST(MlaTest, LseMergesTwoHalves) {
  MlaBatchSpec spec = DeepSeekDecode(16, DType::kBF16);
  spec.q_dtype = DType::kF32;
  spec.kv_dtype = DType::kF32;
  spec.page_size = 16;
  spec.sequences = {{1, 320}, {1, 96}};
  const MlaBatch whole = MakeMlaBatch(spec);
  const MlaOptions options = OptionsFor(whole, false, 1);
  RunResult halves[2];
  for (int half = 0; half < 2; ++half) {
    MlaBatch part = whole;  // The same cache; each sequence keeps half its pages.
    part.kv_indptr = {0};
    part.kv_indices.clear();
    for (size_t i = 0; i < whole.kv_len_arr.size(); ++i) {
      const int32_t pages = whole.kv_indptr[i + 1] - whole.kv_indptr[i];
      const int32_t first = half == 0 ? 0 : pages / 2, count = half == 0 ? pages / 2 : pages - pages / 2;
      for (int32_t j = 0; j < count; ++j) {
        part.kv_indices.push_back(whole.kv_indices[whole.kv_indptr[i] + first + j]);
      }
      part.kv_indptr.push_back(static_cast<int32_t>(part.kv_indices.size()));
      part.kv_len_arr[i] = count * 16;  // Page-aligned lengths: both halves full.
    }
    MlaPlan plan;
    plan.Plan(part.Shape(), part.PageTable(), options);
    halves[half] = RunPlanned(plan, part);
  }
  RunResult merged;
  merged.out = whole.NewOutput();
  merged.lse.assign(halves[0].lse.size(), 0.0f);
  const int64_t t = whole.num_tokens, h = spec.num_heads, d = spec.head_dim_ckv;
  auto out_view = [&](const std::vector<uint8_t>& o) { return TensorView(o.data(), DType::kF32, {t, h, d}); };
  auto lse_view = [&](const std::vector<float>& l) { return TensorView(l.data(), DType::kF32, {t, h}); };
  MergeStates(out_view(halves[0].out), lse_view(halves[0].lse), out_view(halves[1].out),
              lse_view(halves[1].lse), whole.OutView(merged.out),
              MutableTensorView(merged.lse.data(), DType::kF32, {t, h}));
  ExpectNear(whole, merged, MlaReference(whole, false, options.sm_scale, 1.0), "merged halves");
}

TEST(MlaTest, PlanIsSafeAfterTheCallerFreesItsMetadataAndRunsRepeat) {
  const MlaBatch b = MakeMlaBatch(DeepSeekDecode(16, DType::kBF16));
  const MlaOptions options = OptionsFor(b, true, 2);
  MlaPlan plan;
  {
    MlaBatch copy = b;  // Its metadata arrays, freed after Plan.
    plan.Plan(copy.Shape(), copy.PageTable(), options);
    std::fill(copy.kv_indices.begin(), copy.kv_indices.end(), -7);
    std::fill(copy.kv_len_arr.begin(), copy.kv_len_arr.end(), 1 << 30);
  }
  const RunResult first = RunPlanned(plan, b);
  ExpectNear(b, first, MlaReference(b, true, options.sm_scale, 1.0), "after free");
#if RPA_MLA_COUNT_ALLOCATIONS
  RunResult again = first;
  MlaRunExtras extras;
  extras.lse = MutableTensorView(again.lse.data(), DType::kF32, {b.num_tokens, b.spec.num_heads});
  const int64_t before = g_allocations.load();
  for (int i = 0; i < 3; ++i) {
    plan.Run(b.QNope(), b.QPe(), b.CkvCache(), b.KpeCache(), b.OutView(again.out), extras);
  }
  EXPECT_EQ(g_allocations.load(), before) << "a warm run allocated";
  plan.Plan(b.Shape(), b.PageTable(), options);  // Both states warm now.
  const int64_t before_plan = g_allocations.load();
  plan.Plan(b.Shape(), b.PageTable(), options);
  EXPECT_EQ(g_allocations.load(), before_plan) << "a warm plan allocated";
  EXPECT_EQ(again.out, first.out);  // The plan fixes the arithmetic: same bytes.
#endif
}

TEST(MlaTest, EmptyBatchAndSequencesWithoutKeys) {
  MlaBatchSpec spec = DeepSeekDecode(3, DType::kBF16);
  spec.sequences = {{0, 0}, {1, 5}, {0, 0}};
  const MlaBatch b = MakeMlaBatch(spec);
  const MlaOptions options = OptionsFor(b, true, 1);
  MlaPlan plan;
  plan.Plan(b.Shape(), b.PageTable(), options);
  ExpectNear(b, RunPlanned(plan, b), MlaReference(b, true, options.sm_scale, 1.0), "holes");
  spec.sequences.clear();
  const MlaBatch empty = MakeMlaBatch(spec);
  plan.Plan(empty.Shape(), empty.PageTable(), OptionsFor(empty, false, 1));
  EXPECT_EQ(plan.num_tokens(), 0);
  RunPlanned(plan, empty);
}

// ---- Every message, with nothing written.

struct Call {
  MlaBatch batch;
  MlaShape shape;
  MlaOptions options;
  MlaRunExtras extras;
  std::vector<float> lse;
  std::vector<uint8_t> out;
  TensorView q_nope, q_pe, ckv, kpe;
  MutableTensorView out_view;
};

class MlaErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MlaBatchSpec spec;
    spec.num_heads = 4;
    spec.head_dim_ckv = 32;
    spec.head_dim_kpe = 16;
    spec.page_size = 4;
    spec.sequences = {{1, 9}, {2, 3}};
    c_.batch = MakeMlaBatch(spec);
    c_.shape = c_.batch.Shape();
    c_.options = OptionsFor(c_.batch, true, 1);
    c_.out = c_.batch.NewOutput();
    c_.lse.assign(static_cast<size_t>(c_.batch.num_tokens * 4), 7.0f);
    c_.extras.lse = MutableTensorView(c_.lse.data(), DType::kF32, {c_.batch.num_tokens, 4});
    c_.q_nope = c_.batch.QNope();
    c_.q_pe = c_.batch.QPe();
    c_.ckv = c_.batch.CkvCache();
    c_.kpe = c_.batch.KpeCache();
    c_.out_view = c_.batch.OutView(c_.out);
  }

  // Plan (with `table`) must throw `kind` with `message` in its text.
  void ExpectPlanError(const MlaPageTable& table, ErrorKind kind, const std::string& message) {
    MlaPlan plan;
    try {
      plan.Plan(c_.shape, table, c_.options);
      ADD_FAILURE() << "no error; expected: " << message;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
    EXPECT_FALSE(plan.planned());
  }
  void ExpectPlanError(ErrorKind kind, const std::string& message) {
    ExpectPlanError(c_.batch.PageTable(), kind, message);
  }

  // Run must throw, and leave out and lse as they were.
  void ExpectRunError(ErrorKind kind, const std::string& message) {
    MlaPlan plan;
    plan.Plan(c_.batch.Shape(), c_.batch.PageTable(), c_.options);
    const std::vector<uint8_t> out_before = c_.out;
    const std::vector<float> lse_before = c_.lse;
    try {
      plan.Run(c_.q_nope, c_.q_pe, c_.ckv, c_.kpe, c_.out_view, c_.extras);
      ADD_FAILURE() << "no error; expected: " << message;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
    EXPECT_EQ(c_.out, out_before);
    EXPECT_EQ(c_.lse, lse_before);
  }

  Call c_;
};

TEST_F(MlaErrorTest, TheValidCallRuns) {
  MlaPlan plan;
  plan.Plan(c_.shape, c_.batch.PageTable(), c_.options);
  plan.Run(c_.q_nope, c_.q_pe, c_.ckv, c_.kpe, c_.out_view, c_.extras);
}

TEST_F(MlaErrorTest, ShapeAndOptions) {
  c_.shape.num_heads = 129;
  ExpectPlanError(ErrorKind::kShape, "num_heads=129 must be in [1, 128].");
  c_.shape = c_.batch.Shape();
  c_.shape.head_dim_ckv = 520 + 4;
  ExpectPlanError(ErrorKind::kShape, "head_dim_ckv=524 must be a multiple of 16 in [16, 1024].");
  c_.shape = c_.batch.Shape();
  c_.shape.head_dim_kpe = 0;
  ExpectPlanError(ErrorKind::kShape, "head_dim_kpe=0 must be a multiple of 16 in [16, 256].");
  c_.shape = c_.batch.Shape();
  c_.shape.page_size = 0;
  ExpectPlanError(ErrorKind::kShape, "page_size=0 must be positive");
  c_.shape = c_.batch.Shape();
  c_.shape.num_pages = -1;
  ExpectPlanError(ErrorKind::kShape, "num_pages=-1 must be in [0, 2**31).");
  c_.shape = c_.batch.Shape();
  c_.shape.q_dtype = DType::kF8E4M3FN;
  ExpectPlanError(ErrorKind::kDtype,
                  "q_data_type=dtype('float8_e4m3fn') is not supported; q_data_type must be one "
                  "of float32, bfloat16, float16.");
  c_.shape = c_.batch.Shape();
  c_.shape.kv_dtype = DType::kI8;
  ExpectPlanError(ErrorKind::kDtype,
                  "kv_data_type=dtype('int8') is not supported; kv_data_type must be one of "
                  "float32, bfloat16, float16, float8_e4m3fn.");
  c_.shape = c_.batch.Shape();
  c_.options.sm_scale = NAN;
  ExpectPlanError(ErrorKind::kOption, "sm_scale=nan must be finite.");
  c_.options = OptionsFor(c_.batch, true, 0);
  ExpectPlanError(ErrorKind::kOption, "num_threads=0 must be positive.");
}

TEST_F(MlaErrorTest, PageTableViews) {
  MlaPageTable t = c_.batch.PageTable();
  std::vector<int64_t> wide(c_.batch.qo_indptr.begin(), c_.batch.qo_indptr.end());
  t.qo_indptr = TensorView(wide.data(), DType::kI64, {3});
  ExpectPlanError(t, ErrorKind::kDtype, "qo_indptr.dtype=dtype('int64') must be int32.");
  t = c_.batch.PageTable();
  t.kv_indptr = TensorView(c_.batch.kv_indptr.data(), DType::kI32, {1, 3});
  ExpectPlanError(t, ErrorKind::kShape, "kv_indptr.shape=(1, 3) must have 1 dimensions");
  t = c_.batch.PageTable();
  t.qo_indptr = TensorView(c_.batch.qo_indptr.data(), DType::kI32, {0});
  t.kv_indptr = TensorView(c_.batch.kv_indptr.data(), DType::kI32, {0});
  ExpectPlanError(t, ErrorKind::kShape, "qo_indptr.shape=(0,) must have at least one entry.");
  t = c_.batch.PageTable();
  t.kv_indptr = TensorView(c_.batch.kv_indptr.data(), DType::kI32, {2});
  ExpectPlanError(t, ErrorKind::kShape, "kv_indptr.shape=(2,) must be the same as qo_indptr.shape=(3,).");
  t = c_.batch.PageTable();
  t.kv_len_arr = TensorView(c_.batch.kv_len_arr.data(), DType::kI32, {1});
  ExpectPlanError(t, ErrorKind::kShape, "kv_len_arr.shape=(1,) must be (batch_size=2,).");
  t = c_.batch.PageTable();
  t.kv_indices = TensorView(c_.batch.kv_indices.data(), DType::kI32, {2}, {2});
  ExpectPlanError(t, ErrorKind::kLayout, "kv_indices must be contiguous in its last dimension");
}

TEST_F(MlaErrorTest, PageTableValues) {
  auto with = [&](auto edit) {
    MlaBatch b = c_.batch;
    edit(b);
    return b;
  };
  MlaBatch b = with([](MlaBatch& x) { x.qo_indptr[0] = 1; });
  ExpectPlanError(b.PageTable(), ErrorKind::kMetadata, "qo_indptr[0]=1 must be 0.");
  b = with([](MlaBatch& x) { x.qo_indptr = {0, 2, 1}; });
  ExpectPlanError(b.PageTable(), ErrorKind::kMetadata,
                  "qo_indptr[2]=1 must be greater or equal to qo_indptr[1]=2.");
  b = with([](MlaBatch& x) { x.kv_indptr[0] = 1; });
  ExpectPlanError(b.PageTable(), ErrorKind::kMetadata, "kv_indptr[0]=1 must be 0.");
  b = with([](MlaBatch& x) { x.kv_indptr[2] = 9; });
  ExpectPlanError(b.PageTable(), ErrorKind::kMetadata,
                  "kv_indptr[2]=9 must be less or equal to kv_indices.shape[0]=4.");
  b = with([](MlaBatch& x) { x.kv_len_arr[1] = -1; });
  ExpectPlanError(b.PageTable(), ErrorKind::kMetadata, "kv_len_arr[1]=-1 must be non-negative.");
  b = with([](MlaBatch& x) { x.kv_len_arr[1] = 1; });
  ExpectPlanError(b.PageTable(), ErrorKind::kMetadata,
                  "q_len=2 (qo_indptr[2] - qo_indptr[1]) must be less or equal to "
                  "kv_len_arr[1]=1.");
  b = with([](MlaBatch& x) { x.kv_len_arr[0] = 13; });
  ExpectPlanError(b.PageTable(), ErrorKind::kMetadata,
                  "kv_len_arr[0]=13 must be less or equal to 3 pages (kv_indptr[1] - "
                  "kv_indptr[0]) * page_size=4 = 12.");
  b = with([](MlaBatch& x) { x.kv_indices[3] = 6; });
  ExpectPlanError(b.PageTable(), ErrorKind::kPageIndex,
                  "kv_indices[3]=6 must be in range [0, num_pages=6) because sequence 1 reads "
                  "it (kv_len_arr[1]=3).");
}

TEST_F(MlaErrorTest, RunViews) {
  {
    MlaPlan never;
    try {
      never.Run(c_.q_nope, c_.q_pe, c_.ckv, c_.kpe, c_.out_view);
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("This MlaPlan has no plan yet."), std::string::npos);
    }
  }
  const TensorView q_nope = c_.q_nope;
  c_.q_nope = TensorView(q_nope.data, q_nope.dtype, {3, 4, 16});
  ExpectRunError(ErrorKind::kShape,
                 "q_nope.shape=(3, 4, 16) must be (num_tokens=3, num_heads=4, head_dim_ckv=32).");
  c_.q_nope = TensorView(q_nope.data, DType::kF16, {3, 4, 32});
  ExpectRunError(ErrorKind::kDtype,
                 "q_nope.dtype=dtype('float16') must be the planned "
                 "q_data_type=dtype('bfloat16').");
  c_.q_nope = TensorView(q_nope.data, q_nope.dtype, {3, 4, 32}, {128, 32, 2});
  ExpectRunError(ErrorKind::kLayout, "q_nope must be contiguous in its last dimension");
  c_.q_nope = q_nope;
  c_.q_pe = TensorView(c_.q_pe.data, c_.q_pe.dtype, {3, 4});
  ExpectRunError(ErrorKind::kShape, "q_pe.shape=(3, 4) must have 3 dimensions");
  c_.q_pe = c_.batch.QPe();
  c_.ckv = TensorView(c_.ckv.data, c_.ckv.dtype, {5, 4, 32});
  ExpectRunError(ErrorKind::kShape,
                 "ckv_cache.shape=(5, 4, 32) must be (num_pages=6, page_size=4, "
                 "head_dim_ckv=32).");
  c_.ckv = c_.batch.CkvCache();
  c_.kpe = TensorView(c_.kpe.data, DType::kF16, {6, 4, 16});
  ExpectRunError(ErrorKind::kDtype,
                 "kpe_cache.dtype=dtype('float16') must be the planned "
                 "kv_data_type=dtype('bfloat16').");
  c_.kpe = c_.batch.KpeCache();
  c_.out_view = MutableTensorView(c_.out.data(), DType::kBF16, {3, 4, 16});
  ExpectRunError(ErrorKind::kShape,
                 "out.shape=(3, 4, 16) must be (num_tokens=3, num_heads=4, head_dim_ckv=32).");
  c_.out_view = c_.batch.OutView(c_.out);
  c_.extras.kv_scale = 0.0;
  ExpectRunError(ErrorKind::kOption, "kv_scale=0.0 must be positive and finite.");
  c_.extras.kv_scale = 1.0;
  c_.extras.lse = MutableTensorView(c_.lse.data(), DType::kF32, {3, 5});
  ExpectRunError(ErrorKind::kShape, "lse.shape=(3, 5) must be (num_tokens=3, num_heads=4).");
  c_.extras.lse = MutableTensorView(c_.lse.data(), DType::kF16, {3, 4});
  ExpectRunError(ErrorKind::kDtype, "lse.dtype=dtype('float16') must be float32.");
}

}  // namespace
}  // namespace rpa
