// The fast kernel against the f64 reference: a randomized grid over every
// feature, on every compiled Highway target and on every dispatch path
// (forced by hiding CPU features), with 1-4 threads; plus the kernels' tile
// functions, the dispatch, the plan, the thread pool and run-to-run identity.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "hwy/targets.h"
#include "kernel/avx512_bf16_rows.h"
#include "kernel/avx512_common.h"  // x86-64 only: its exp, tested alone.
#include "kernel/avx512_fp16_decode.h"
#include "kernel/avx512_wide.h"
#include "kernel/cpu_features.h"
#include "kernel/kernel.h"
#include "kernel/kernel_records.h"
#include "kernel/next_tile_rows.h"
#include "plan/plan.h"
#include "reference/reference_impl.h"
#include "rpa/dtype.h"
#include "rpa/rpa.h"
#include "run/compute.h"
#include "testing/amx_emulation.h"
#include "testing/synthetic_batch.h"
#include "testing/tolerance.h"
#include "testing/without_amx.h"
#include "threads/thread_pool.h"
#include "validate/validate_internal.h"

namespace rpa::internal {
namespace {

using testing::BatchSpec;
using testing::SequenceShape;
using testing::SyntheticBatch;

// Sanitizer builds run a smaller grid (same features, fewer draws).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kGridScale = 1;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr int kGridScale = 1;
#else
constexpr int kGridScale = 3;
#endif
#else
constexpr int kGridScale = 3;
#endif

struct Case {
  BatchSpec spec;
  AttentionOptions options;
  bool sinks = false;
  bool lse = false;
  int threads = 1;

  std::string Name() const {
    std::ostringstream s;
    s << "q=" << ToString(spec.q_dtype) << " kv=" << ToString(spec.kv_dtype)
      << " heads=" << spec.num_q_heads << "/" << spec.num_kv_heads << " D=" << spec.head_dim
      << " page=" << spec.page_size << " seqs=[";
    for (const SequenceShape& q : spec.sequences) s << q.q_len << "/" << q.kv_len << " ";
    s << "] ppb=" << options.num_kv_pages_per_block.value_or(0)
      << " qpb=" << options.num_queries_per_block.value_or(0)
      << " window=" << options.sliding_window.value_or(0)
      << " cap=" << options.soft_cap.value_or(0) << " mask=" << options.mask_value.value_or(0)
      << " sm=" << options.sm_scale << " ks=" << options.k_scale.value_or(1)
      << " vs=" << options.v_scale.value_or(1) << " sinks=" << sinks << " lse=" << lse
      << " threads=" << threads;
    return s.str();
  }
};

template <typename T>
T Pick(std::mt19937_64& rng, std::initializer_list<T> values) {
  std::uniform_int_distribution<size_t> index(0, values.size() - 1);
  return values.begin()[index(rng)];
}

Case RandomCase(std::mt19937_64& rng, DType kv_dtype) {
  auto coin = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Case c;
  BatchSpec& s = c.spec;
  s.q_dtype = Pick(rng, {DType::kF32, DType::kBF16, DType::kF16});
  s.kv_dtype = kv_dtype;
  const int64_t group = Pick<int64_t>(rng, {1, 2, 4, 8, 32});
  s.num_kv_heads = group == 32 ? 1 : Pick<int64_t>(rng, {1, 2});
  s.num_q_heads = group * s.num_kv_heads;
  s.head_dim = Pick<int64_t>(rng, {1, 3, 7, 16, 31, 32, 33, 64, 100, 128, 256});
  s.page_size = Pick<int64_t>(rng, {1, 3, 7, 16, 16, 64, 256});
  // Work per case stays small: keys x rows x head_dim bounded.
  const int64_t max_kv = std::max<int64_t>(4, 120000 / (s.num_q_heads * s.head_dim));
  const int64_t num_seqs = Pick<int64_t>(rng, {0, 1, 1, 2, 3, 5});
  for (int64_t i = 0; i < num_seqs; ++i) {
    SequenceShape q;
    q.kv_len = static_cast<int32_t>(coin(0.1) ? 0 : uniform(1, std::min<int64_t>(max_kv, 700)));
    const int kind = static_cast<int>(uniform(0, 3));
    q.q_len = kind == 0   ? std::min(q.kv_len, 1)
              : kind == 1 ? q.kv_len
              : kind == 2 ? static_cast<int32_t>(uniform(0, std::min<int32_t>(q.kv_len, 40)))
                          : 0;
    s.sequences.push_back(q);
  }
  s.max_num_seqs = num_seqs + uniform(0, 2);
  int64_t longest = 1;
  for (const SequenceShape& q : s.sequences) {
    longest = std::max(longest, (q.kv_len + s.page_size - 1) / s.page_size);
  }
  s.pages_per_seq = longest + uniform(0, 2);
  int64_t total_q = 0;
  for (const SequenceShape& q : s.sequences) total_q += q.q_len;
  s.max_num_batched_tokens = std::max<int64_t>(1, total_q + uniform(0, 3));
  s.seed = rng();

  AttentionOptions& o = c.options;
  const int ppb = static_cast<int>(uniform(0, 3));
  if (s.max_num_seqs > 0) {  // Else page_indices has no columns to tile.
    if (ppb == 1) o.num_kv_pages_per_block = 1;
    if (ppb == 2) o.num_kv_pages_per_block = s.pages_per_seq;
    if (ppb == 3) o.num_kv_pages_per_block = uniform(1, s.pages_per_seq);
  }
  const int qpb = static_cast<int>(uniform(0, 2));
  if (qpb == 1) o.num_queries_per_block = 1;
  if (qpb == 2) o.num_queries_per_block = uniform(1, 20);
  if (coin(0.3)) o.sliding_window = uniform(1, 60);
  if (coin(0.3)) o.soft_cap = static_cast<double>(uniform(5, 50));
  const int mask = static_cast<int>(uniform(0, 3));
  if (mask == 1) o.mask_value = -static_cast<double>(uniform(1, 30));  // Additive.
  if (mask == 2) o.mask_value = -1e4;                                  // Vanishes.
  o.sm_scale = Pick<double>(rng, {1.0, 1.0 / std::sqrt(static_cast<double>(s.head_dim)), 0.3});
  if (coin(0.3)) o.k_scale = Pick<double>(rng, {0.5, 1.7});
  if (coin(0.3)) o.v_scale = Pick<double>(rng, {0.25, 2.0});
  c.sinks = coin(0.2);
  c.lse = coin(0.3);
  c.threads = static_cast<int>(uniform(1, 4));
  return c;
}

// The logits' spread for unit-normal q and K: their rounding grows with it.
double LogitStd(const Case& c) {
  return c.options.sm_scale * c.options.k_scale.value_or(1.0) *
         std::sqrt(static_cast<double>(c.spec.head_dim));
}

// Max error allowed for one output element: the K/V dtype's bound (docs/contract.md §1),
// which holds for unit-normal inputs, scaled where the case leaves them:
// v_scale scales the output, and logits wider than about unit-normal (std
// sm_scale * k_scale * sqrt(head_dim), e.g. 10 with sm_scale 1 and head_dim
// 100) carry f32 rounding of about 2^-24 of their size into the weights;
// plus one ulp of the output dtype (both sides round slightly different f32
// values).
double Tolerance(const Case& c, double reference) {
  const BatchSpec& s = c.spec;
  const double kv = testing::KvTolerance(s.kv_dtype) * c.options.v_scale.value_or(1.0) *
                    std::max(1.0, LogitStd(c) / 4.0);
  return kv + testing::OutputRounding(s.q_dtype, reference) * 1.01;
}

// Max LSE error: f32 softmax sums (relative 1e-4, scaled like the outputs'
// tolerance by the logits' spread), except that 8-bit float decode tiles may
// run in f16 arithmetic (avx512fp16_decode), whose logits are off by up to
// ~2^-11 of their partial sums: of the LSE itself, or of sum_d |q_d k_d|
// (~0.64 sqrt(D) LogitStd for unit-normal inputs) where terms cancel.
double LseTolerance(const Case& c, double want) {
  const double spread = std::max(1.0, LogitStd(c) / 4.0);
  if (SizeOf(c.spec.kv_dtype) != 1) return 1e-4 * (1.0 + std::fabs(want)) * spread;
  const double dims = std::sqrt(static_cast<double>(c.spec.head_dim));
  return 2e-3 * (1.0 + std::fabs(want)) * spread + 1e-3 * dims * LogitStd(c);
}

struct Outputs {
  std::vector<uint8_t> out;
  std::vector<float> lse;
};

// Runs the case on the fast path (ComputeAttention) or the reference.
Outputs RunCase(const Case& c, const SyntheticBatch& b, bool fast) {
  Outputs result;
  result.out.assign(b.q.size(), 0xAB);  // Garbage: every row must be written.
  AttentionOptions options = c.options;
  options.num_threads = c.threads;
  AttentionProblem problem = ValidateRagged(
      CombinedInputs(b.Q(), b.KvPages(),
                     PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}),
      options, b.OutView(result.out));
  std::vector<float> sinks;
  if (c.sinks) {
    for (int64_t h = 0; h < c.spec.num_q_heads; ++h) sinks.push_back(0.5f * (h % 5) - 1.0f);
    problem.sinks = sinks.data();
  }
  if (c.lse) {
    result.lse.assign(static_cast<size_t>(b.num_tokens * c.spec.num_q_heads), 12345.0f);
    problem.lse = result.lse.data();
    problem.lse_token_stride = c.spec.num_q_heads;
  }
  if (fast) {
    ComputeAttention(problem);
  } else {
    ReferenceAttention(problem);
  }
  return result;
}

// Compares, printing only the first few mismatches.
// What a comparison does where the reference is NaN or infinite: fail (the
// grids, whose inputs are finite), or want the same (a case that injects a
// NaN or an infinity).
enum class NonFinite : uint8_t { kFails, kLikeReference };

// got within tol of want, or under kLikeReference testing::LikeReference.
bool Matches(double got, double want, double tol, NonFinite non_finite) {
  return non_finite == NonFinite::kLikeReference ? testing::LikeReference(got, want, tol)
                                                 : std::fabs(got - want) <= tol;
}

void ExpectClose(const Case& c, const SyntheticBatch& b, const Outputs& fast, const Outputs& ref,
                 NonFinite non_finite = NonFinite::kFails) {
  const int64_t count = b.num_tokens * c.spec.num_q_heads * c.spec.head_dim;
  int reported = 0;
  for (int64_t i = 0; i < count && reported < 3; ++i) {
    const double got = LoadAsF32(c.spec.q_dtype, fast.out.data(), i);
    const double want = LoadAsF32(c.spec.q_dtype, ref.out.data(), i);
    if (!Matches(got, want, Tolerance(c, want), non_finite)) {
      ADD_FAILURE() << c.Name() << "\n  element " << i << " (token "
                    << i / (c.spec.num_q_heads * c.spec.head_dim) << "): got " << got
                    << " want " << want;
      ++reported;
    }
  }
  for (size_t i = 0; i < ref.lse.size() && reported < 3; ++i) {
    const float got = fast.lse[i], want = ref.lse[i];
    const bool same = (std::isinf(want) && got == want) ||
                      Matches(got, want, LseTolerance(c, want), non_finite);
    if (!same) {
      ADD_FAILURE() << c.Name() << "\n  lse " << i << ": got " << got << " want " << want;
      ++reported;
    }
  }
}

// RPA_KERNEL_TEST_SCALE=n multiplies the grid, for a longer soak by hand.
int SoakScale() {
  const char* env = std::getenv("RPA_KERNEL_TEST_SCALE");
  const int scale = env != nullptr ? std::atoi(env) : 1;
  return scale > 0 ? scale : 1;
}

void CheckGrid(uint64_t seed, int cases, std::initializer_list<DType> kv_dtypes) {
  std::mt19937_64 rng(seed);
  cases *= SoakScale();
  for (int i = 0; i < cases; ++i) {
    for (DType kv : kv_dtypes) {
      const Case c = RandomCase(rng, kv);
      const SyntheticBatch b = testing::MakeSyntheticBatch(c.spec);
      const Outputs ref = RunCase(c, b, /*fast=*/false);
      const Outputs fast = RunCase(c, b, /*fast=*/true);
      ExpectClose(c, b, fast, ref);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

const std::initializer_list<DType> kAllKv = {DType::kF32,      DType::kBF16,   DType::kF16,
                                             DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8};

// ---- Every compiled Highway target, the ISA-specific kernels hidden.
class KernelTargetTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { hwy::SetSupportedTargetsForTest(GetParam()); }
  void TearDown() override { hwy::SetSupportedTargetsForTest(0); }
  // The Highway kernels only.
  ScopedCpuFeatureMask portable_{kNoCpuFeatures};
};

TEST_P(KernelTargetTest, RandomGridMatchesReference) {
  CheckGrid(1000 + static_cast<uint64_t>(GetParam() % 997), 3 * kGridScale, kAllKv);
}

// f16 and e5m2 inf and NaN codes are exact on every target, though Highway
// emulates the f16 conversion on some (SSE4, EMU128: it made them finite
// there, a fuzz finding). K/V and q of both dtypes, a decode row
// (highway_rows) and a prefill (highway_packed): kv head 0 holds a NaN key
// (its rows NaN), kv head 1 a +inf value (that dimension +inf), and a q row
// of kv head 1's group a NaN (that row NaN).
TEST_P(KernelTargetTest, HalfInfAndNanCodesAreExact) {
  struct Codes {
    DType dtype;
    uint16_t nan, inf;  // 8-bit dtypes: the low byte.
  };
  for (const Codes codes : {Codes{DType::kF16, 0x7E00, 0x7C00}, Codes{DType::kF8E5M2, 0x7F, 0x7C}}) {
    Case c;
    c.spec.q_dtype = DType::kF16;
    c.spec.kv_dtype = codes.dtype;
    c.spec.num_q_heads = 4;
    c.spec.num_kv_heads = 2;
    c.spec.head_dim = 9;
    c.spec.page_size = 8;
    c.spec.sequences = {{1, 5}, {40, 40}};  // Decode, then a prefill of 40 rows.
    c.spec.max_num_batched_tokens = 41;
    c.spec.seed = 7;
    c.options.sm_scale = 0.3;
    SyntheticBatch b = testing::MakeSyntheticBatch(c.spec);
    const int64_t elem = static_cast<int64_t>(SizeOf(codes.dtype)), dim = c.spec.head_dim;
    auto put = [&](uint8_t* base, int64_t index, uint16_t code) {
      std::memcpy(base + index * elem, &code, static_cast<size_t>(elem));
    };
    for (int64_t seq = 0; seq < 2; ++seq) {
      // Key 0 of each sequence: [page, slot 0, 2 * kv_head + (0: K, 1: V), dim].
      const int64_t row = b.page_indices[static_cast<size_t>(seq * b.pages_per_seq)] *
                          c.spec.page_size * 2 * c.spec.num_kv_heads;
      put(b.kv_pages.data(), (row + 0) * dim + 2, codes.nan);  // K, kv head 0.
      put(b.kv_pages.data(), (row + 3) * dim + 1, codes.inf);  // V, kv head 1.
    }
    // q row of token 3 (the prefill's third), q head 3 (kv head 1), dim 4.
    const uint16_t q_nan = 0x7E00;
    std::memcpy(b.q.data() + ((3 * c.spec.num_q_heads + 3) * dim + 4) * 2, &q_nan, 2);
    const Outputs ref = RunCase(c, b, /*fast=*/false);
    const Outputs fast = RunCase(c, b, /*fast=*/true);
    int nan = 0, inf = 0;
    for (int64_t i = 0; i < b.num_tokens * c.spec.num_q_heads * dim; ++i) {
      const float want = LoadAsF32(DType::kF16, ref.out.data(), i);
      const float got = LoadAsF32(DType::kF16, fast.out.data(), i);
      if (std::isnan(want)) {
        ++nan;
        EXPECT_TRUE(std::isnan(got)) << ToString(codes.dtype) << " element " << i << ": " << got;
      } else if (std::isinf(want)) {
        ++inf;
        EXPECT_EQ(got, want) << ToString(codes.dtype) << " element " << i;
      } else {
        EXPECT_NEAR(got, want, Tolerance(c, want)) << ToString(codes.dtype) << " element " << i;
      }
    }
    // The reference saw each kind: kv head 0's rows, head 1's dimension 1, the NaN q row.
    EXPECT_EQ(nan, (41 * 2 + 1) * dim) << ToString(codes.dtype);
    EXPECT_EQ(inf, 41 * 2 - 1) << ToString(codes.dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, KernelTargetTest,
                         ::testing::ValuesIn(hwy::SupportedAndGeneratedTargets()),
                         [](const ::testing::TestParamInfo<int64_t>& param) {
                           return std::string(hwy::TargetName(param.param));
                         });

// The features of a CPU whose vdpbf16ps is slow, without AMX (the Intel
// machines with RPA_AMX=0, or before Sapphire Rapids): the widening path and
// highway_packed, where dispatch would otherwise choose the bf16-pair
// kernels or amx_prefill, and each kv head prefetching its own rows.
CpuFeatures SlowBf16Dot() {
  CpuFeatures f = kAllCpuFeatures;
  f.fast_bf16_dot = false;
  f.prefetch_in_address_order = false;
  f.amx_bf16 = false;
  return f;
}

// ---- The AVX-512 widening path (-> f32 in registers, FMA) for bf16, f16
// and 8-bit float K/V (skipped where the CPU lacks AVX-512 BW).
TEST(KernelWideTest, RandomGridMatchesReference) {
  if (!DetectedCpuFeatures().avx512bw) GTEST_SKIP() << "no AVX-512 BW on this CPU";
  ScopedCpuFeatureMask slow_dot(SlowBf16Dot());
  CheckGrid(79, 12 * kGridScale, {DType::kBF16});
  CheckGrid(80, 6 * kGridScale, {DType::kF8E4M3FN, DType::kF8E5M2});
  CheckGrid(82, 6 * kGridScale, {DType::kF16});
}

#if defined(__x86_64__)
// The softmaxes' exp on AVX-512 (avx512_common.h; every Highway AVX3
// softmax calls it too) against std::exp: within 2.5e-7 relative (about 2
// ulp) over [kLowest, 0], exactly 1 at 0, exactly 0 below kLowest, at -inf
// and at NaN (which the softmax detects before, and never weighs).
RPA_AVX512_TARGET void AvxExp16(const float* x, float* y) {
  _mm512_storeu_ps(y, avx512::ExpNonPositive(_mm512_loadu_ps(x)));
}
TEST(KernelWideTest, ExpNonPositiveMatchesStdExp) {
  if (!DetectedCpuFeatures().avx512bw) GTEST_SKIP() << "no AVX-512 on this CPU";
  constexpr int64_t kSteps = 16 * 50000;
  constexpr double kStep = 90.0 / kSteps;  // x from -90 up to 0.
  double worst = 0;
  float x[16], y[16];
  for (int64_t k = 0; k < kSteps; k += 16) {
    for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(-90.0 + kStep * static_cast<double>(k + i));
    AvxExp16(x, y);
    for (int i = 0; i < 16; ++i) {
      if (x[i] < exp_non_positive::kLowest) {
        ASSERT_EQ(y[i], 0.0f) << "x = " << x[i];
      } else {
        const double want = std::exp(static_cast<double>(x[i]));
        worst = std::max(worst, std::fabs(y[i] - want) / want);
      }
    }
  }
  EXPECT_LT(worst, 2.5e-7);
  const float inf = std::numeric_limits<float>::infinity();
  const float special[16] = {0.0f, -0.0f, -inf, std::numeric_limits<float>::quiet_NaN()};
  AvxExp16(special, y);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 1.0f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[3], 0.0f);
}
#endif  // defined(__x86_64__)

// ---- The bf16 prefill kernels (avx512_bf16_packed; amx_prefill on its
// scalar tile model, AMX tiles or not): the grid with bf16 q (their only q)
// and K/V they take exactly, every
// query tile of every sequence a prefill task (>= 32 rows per kv head), so
// the packs, the row padding, the in-place bf16 weights and the softmax
// between the products all run against the reference.
void CheckBf16PrefillGrid(uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 6 * kGridScale * SoakScale(); ++i) {
    for (DType kv : {DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8}) {
      Case c = RandomCase(rng, kv);
      c.spec.q_dtype = DType::kBF16;
      const int64_t group = c.spec.num_q_heads / c.spec.num_kv_heads;
      const int64_t q_block = (kPackedMinRows + group - 1) / group;  // Tokens per prefill tile.
      c.options.num_queries_per_block = q_block;
      for (SequenceShape& s : c.spec.sequences) {
        if (s.q_len > 0) s.q_len = std::min<int32_t>(s.kv_len, static_cast<int32_t>(q_block));
      }
      int64_t tokens = 0;
      for (const SequenceShape& s : c.spec.sequences) tokens += s.q_len;
      c.spec.max_num_batched_tokens = std::max<int64_t>(tokens, 1);
      const SyntheticBatch b = testing::MakeSyntheticBatch(c.spec);
      ExpectClose(c, b, RunCase(c, b, /*fast=*/true), RunCase(c, b, /*fast=*/false));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(KernelAmxTest, PrefillGridMatchesReference) {
  if (!DetectedCpuFeatures().avx512bf16) GTEST_SKIP() << "the tile model needs AVX-512 BF16";
  testing::ScopedAmxEmulation emulate;
  CheckBf16PrefillGrid(83);
}

// The AVX-512 BF16 packed prefill kernel, where dispatch chooses it (AMD's
// rules, forced on other CPUs with AVX-512 BF16; AMX hidden).
TEST(KernelBf16PackedTest, PrefillGridMatchesReference) {
  if (!DetectedCpuFeatures().avx512bf16) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  ScopedCpuRules zen5(CpuRules::kZen5);
  testing::ScopedWithoutAmx hide_amx;
  CheckBf16PrefillGrid(84);
}

// Decode batches, where the widening path takes the fused tile
// (avx512_wide_decode, or for 8-bit floats avx512fp16_decode where the CPU
// has AVX512-FP16, checked with it hidden and not): 1-8 q heads per kv
// head (groups of 4 and a last smaller one; avx512_wide_decode leaves a last
// 1-2 rows to the unfused path), one or two queries per sequence, mostly no
// soft cap; windows make some tiles partly visible (the unfused path).
//
// Decode and middle-class batches: 1-8 q heads per kv head, 1, 2 or (for
// the middle class, with queries_scale 4) 4-8 queries per sequence.
void CheckDecodeGrid(uint64_t seed, std::initializer_list<DType> kv_dtypes, int queries_scale,
                     bool bf16_q, const CpuFeatures& even_mask, const CpuFeatures& odd_mask) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 10 * kGridScale * SoakScale(); ++i) {
    for (DType kv : kv_dtypes) {
      ScopedCpuFeatureMask mask(i % 2 == 0 ? even_mask : odd_mask);
      Case c = RandomCase(rng, kv);
      if (bf16_q) c.spec.q_dtype = DType::kBF16;
      const int64_t group = 1 + i % 8;
      const int32_t queries = (i % 5 == 4 ? 2 : 1) * queries_scale;
      c.spec.num_q_heads = group * c.spec.num_kv_heads;
      for (SequenceShape& q : c.spec.sequences) q.q_len = std::min(q.kv_len, queries);
      c.spec.max_num_batched_tokens = std::max<int64_t>(1, queries * c.spec.max_num_seqs);
      if (i % 3 != 0) c.options.soft_cap.reset();
      const SyntheticBatch b = testing::MakeSyntheticBatch(c.spec);
      ExpectClose(c, b, RunCase(c, b, /*fast=*/true), RunCase(c, b, /*fast=*/false));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(KernelWideTest, DecodeGridMatchesReference) {
  if (!DetectedCpuFeatures().avx512bw) GTEST_SKIP() << "no AVX-512 BW on this CPU";
  // Odd draws: the f32 fused tile only (no AVX512-FP16 tile).
  CheckDecodeGrid(81, {DType::kBF16, DType::kF16, DType::kF8E4M3FN, DType::kF8E5M2}, 1,
                  /*bf16_q=*/false, SlowBf16Dot(),
                  CpuFeatures{.avx512bw = true, .avx512bf16 = true});
  // int8: the f16 tile where the CPU has AVX512-FP16 (even draws), else the
  // widening kernels (odd: AVX-512 BW only, which hides the bf16 pairs too);
  // decode, then the middle class (neither mask has AMX).
  CheckDecodeGrid(90, {DType::kI8}, 1, /*bf16_q=*/false, SlowBf16Dot(),
                  CpuFeatures{.avx512bw = true});
  CheckDecodeGrid(91, {DType::kI8}, 1, /*bf16_q=*/true, SlowBf16Dot(),
                  CpuFeatures{.avx512bw = true});
  CheckDecodeGrid(92, {DType::kI8}, 4, /*bf16_q=*/false, SlowBf16Dot(),
                  CpuFeatures{.avx512bw = true});
}

// ---- The bf16-pair kernels (avx512_bf16_decode > avx512_bf16_rows) where
// dispatch chooses them: bf16 q over bf16, 8-bit float and int8 K/V, decode and
// the middle class (1-8 q heads x up to 8 queries), fused and unfused tiles
// (soft caps, windows, groups of 1-2 rows), every option of the grid.
TEST(KernelBf16RowsTest, DecodeGridMatchesReference) {
  if (!DetectedCpuFeatures().avx512bf16) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  // AMD's rules (the bf16-pair kernels; Zen 4 prefetches each kv head's
  // rows, Zen 5 every head's in address order) on any CPU with AVX-512
  // BF16; AMX hidden (it would take the middle class).
  testing::ScopedWithoutAmx hide_amx;
  for (const CpuRules rules : {CpuRules::kZen4, CpuRules::kZen5}) {
    ScopedCpuRules amd(rules);
    for (int queries_scale : {1, 4}) {
      CheckDecodeGrid(85 + queries_scale + 2 * static_cast<int>(rules),
                      {DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8},
                      queries_scale, /*bf16_q=*/true, kAllCpuFeatures, kAllCpuFeatures);
    }
  }
}

// amx_prefill on the hardware's tiles, where dispatch chooses it: the
// prefill grid, and decode and middle-class batches (4-8 queries x 1-8 q
// heads per kv head: the middle class runs on the tiles from 9 rows).
TEST(KernelAmxTest, HardwareGridsMatchReference) {
  if (!DetectedCpuFeatures().amx_bf16) GTEST_SKIP() << "AMX: " << AmxDetection();
  CheckBf16PrefillGrid(87);
  CheckDecodeGrid(88, {DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8}, 4,
                  /*bf16_q=*/true, kAllCpuFeatures, kAllCpuFeatures);
}

// The middle class on the tile model: bf16 q over K/V the tiles take
// exactly, 4-8 queries x 1-8 q heads per kv head.
TEST(KernelAmxTest, MiddleGridMatchesReference) {
  if (!DetectedCpuFeatures().avx512bf16) GTEST_SKIP() << "the tile model needs AVX-512 BF16";
  testing::ScopedAmxEmulation emulate;
  CheckDecodeGrid(89, {DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8}, 4,
                  /*bf16_q=*/true, kAllCpuFeatures, kAllCpuFeatures);
}

TEST(KernelTileTest, QIndexIsAPermutation) {
  std::vector<int> seen(64, 0);
  for (int64_t d = 0; d < 64; ++d) ++seen[WideQIndex(d)];
  for (int count : seen) EXPECT_EQ(count, 1);
}

#if defined(__x86_64__)
// ---- The AVX-512 kernels' tile functions on their own.

// A tile of n keys: K rows `rows`, V rows the same pointers plus v_offset
// bytes (as a page's other kv heads are); with_next: the same rows again as
// the next tile, prefetched and never read.
KvTile TestTile(DType dtype, int64_t head_dim, const std::vector<const uint8_t*>& rows,
                int64_t v_offset, int64_t n, bool with_next = false) {
  KvTile tile;
  tile.head_dim = head_dim;
  tile.row_bytes = head_dim * static_cast<int64_t>(SizeOf(dtype));
  tile.n = n;
  tile.k = {rows.data(), 0, n};
  tile.v = {rows.data(), v_offset, n};
  if (with_next) {
    tile.k_next = tile.k;
    tile.v_next = tile.v;
  }
  return tile;
}

std::vector<const uint8_t*> RowPointers(const uint8_t* base, int64_t n, int64_t row_bytes) {
  std::vector<const uint8_t*> rows(n);
  for (int64_t t = 0; t < n; ++t) rows[t] = base + t * row_bytes;
  return rows;
}

bool HasAvx512Bw() { return DetectedCpuFeatures().avx512bw; }
bool HasAvx512Fp16() { return DetectedCpuFeatures().avx512fp16; }
bool HasAvx512Bf16() { return DetectedCpuFeatures().avx512bf16; }

// Every 8-bit float code through the widening kernel's table conversion.
TEST(KernelWideTest, Fp8RowsToBf16IsExact) {
  if (!HasAvx512Bw()) GTEST_SKIP() << "no AVX-512 BW on this CPU";
  for (DType dtype : {DType::kF8E4M3FN, DType::kF8E5M2}) {
    std::vector<uint8_t> codes(256 + 7);  // head_dim 263: a masked tail.
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i);
    std::vector<uint16_t> out(288, 0xFFFF);
    const uint8_t* converted[1] = {nullptr};
    TileScratch scratch;
    scratch.dim_pad = 288;
    scratch.kv_bf16 = out.data();
    scratch.converted = converted;
    const std::vector<const uint8_t*> rows = {codes.data()};
    const KvRows got_rows = Fp8RowsToBf16(dtype, KvRows{rows.data(), 0, 1}, 1,
                                          static_cast<int64_t>(codes.size()), scratch);
    EXPECT_EQ(got_rows[0], static_cast<const void*>(out.data()));
    const float scale = dtype == DType::kF8E4M3FN ? 1.0f / 256.0f : 1.0f;
    for (size_t i = 0; i < codes.size(); ++i) {
      const float want = LoadAsF32(dtype, codes.data(), static_cast<int64_t>(i)) * scale;
      const float got = F32FromBF16(BF16{out[i]});
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << ToString(dtype) << " code " << i;
      } else {
        EXPECT_EQ(got, want) << ToString(dtype) << " code " << i;
      }
    }
    for (size_t i = codes.size(); i < out.size(); ++i) EXPECT_EQ(out[i], 0) << i;
  }
}

// Bit-identical, except that NaNs may differ in sign and payload (which NaN
// operand an add or FMA passes on depends on the compiler's operand order).
bool SameOrBothNan(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  }
  return true;
}

// fp8 K/V converted inside the widening loops (avx512_wide, decode) and
// converted into scratch per tile (avx512_wide_fp8_scratch, middle class)
// both give bit for bit what converting the rows to bf16 first
// (Fp8RowsToBf16) and running the bf16 instance gives (NaN for NaN):
// every code (NaN and the masked tail included), each logits and PV block
// shape.
TEST(KernelWideTest, Fp8InLoopsMatchesBf16Rows) {
  if (!HasAvx512Bw()) GTEST_SKIP() << "no AVX-512 BW on this CPU";
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (DType dtype : {DType::kF8E4M3FN, DType::kF8E5M2}) {
    for (int64_t head_dim : {int64_t{263}, int64_t{128}, int64_t{5}}) {
      constexpr int64_t tokens = 19;
      const int64_t pad = RoundUp(head_dim, 32);
      std::vector<uint8_t> codes(tokens * head_dim);
      for (size_t i = 0; i < codes.size(); ++i) {
        codes[i] = static_cast<uint8_t>(i < 256 ? i : rng() & 0xFF);
      }
      std::vector<uint16_t> bf16(tokens * pad, 0);
      const std::vector<const uint8_t*> raw = RowPointers(codes.data(), tokens, head_dim);
      std::vector<const uint8_t*> conv(tokens);
      TileScratch scratch;
      scratch.dim_pad = pad;
      scratch.kv_bf16 = bf16.data();
      scratch.converted = conv.data();
      Fp8RowsToBf16(dtype, KvRows{raw.data(), 0, tokens}, tokens, head_dim, scratch);
      const KvTile raw_tile = TestTile(dtype, head_dim, raw, 0, tokens);
      KvTile conv_tile = TestTile(DType::kBF16, head_dim, conv, 0, tokens);
      // The fp8 instances (converting in the loops, or the whole tile into
      // scratch first) on the codes, the bf16 one on the converted rows.
      const ProductKernel& wide_bf16 = *Avx512Wide(DType::kBF16);
      // The kernel under test converts into scratch of its own.
      std::vector<uint16_t> own_bf16(tokens * pad, 0);
      std::vector<const uint8_t*> own_conv(tokens);
      TileScratch own = scratch;
      own.kv_bf16 = own_bf16.data();
      own.converted = own_conv.data();
      for (const ProductKernel* fp8 : {Avx512Wide(dtype), Avx512WideFp8Scratch(dtype)}) {
        const ProductKernel& wide = *fp8;
        for (int64_t rows : {1, 2, 3, 4, 5, 8, 9, 16}) {
          // The 4 x 4 logits blocks read q rows up to a multiple of 4, as the
          // kernel's scratch has them.
          std::vector<float> q(RoundUp(rows, 4) * pad, 0.0f);
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t d = 0; d < head_dim; ++d) q[r * pad + d] = normal(rng);
          }
          const int64_t s_stride = 32;
          std::vector<float> s_raw(rows * s_stride, 0.0f), s_conv(rows * s_stride, 0.0f);
          const QueryRows q_rows{q.data(), pad, rows, nullptr};
          wide.logits(q_rows, raw_tile, TileLogits{s_raw.data(), s_stride, rows}, own);
          wide_bf16.logits(q_rows, conv_tile, TileLogits{s_conv.data(), s_stride, rows}, scratch);
          EXPECT_TRUE(SameOrBothNan(s_raw, s_conv)) << wide.name << " " << ToString(dtype)
                                                    << " head_dim " << head_dim << " rows " << rows;
          // PV with q's values as the weights (NaN codes make NaN in both).
          std::vector<float> acc_raw(rows * pad, 0.0f), acc_conv(rows * pad, 0.0f);
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t d = 0; d < head_dim; ++d) acc_raw[r * pad + d] = normal(rng);
          }
          acc_conv = acc_raw;
          const TileLogits p{q.data(), pad, rows};
          wide.pv(p, raw_tile, SoftmaxState{nullptr, nullptr, acc_raw.data(), pad}, own);
          wide_bf16.pv(p, conv_tile, SoftmaxState{nullptr, nullptr, acc_conv.data(), pad}, scratch);
          EXPECT_TRUE(SameOrBothNan(acc_raw, acc_conv))
              << wide.name << " " << ToString(dtype) << " head_dim " << head_dim << " rows "
              << rows;
        }
      }
    }
  }
}

// The fused decode tiles against the online-softmax update computed in f64:
// 1-4 rows, every key count up to a tile, head dims with and without a
// chunk tail, a fresh and a running state; the state of rows past `rows`
// (and the rows' scratch past them) stays untouched. avx512_wide_decode
// (f32 arithmetic) for bf16, f16, both 8-bit floats and int8, and
// avx512fp16_decode (f16 products and tile sums) for the 8-bit ones where the CPU has
// AVX512-FP16, whose logits may be off by ~2^-11 of sum_d |q_d k_d| at each
// of ~10 roundings (tolerance 2^-8 of it) and its weighted sums likewise.
TEST(KernelWideTest, DecodeTileMatchesOnlineSoftmax) {
  if (!HasAvx512Bw()) GTEST_SKIP() << "no AVX-512 BW on this CPU";
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  constexpr int64_t kRows = 4;
  int64_t rows = 0;
  // Each fused tile, with its rounding: f16 products and sums (half), or bf16
  // q and weights (pairs); the widening tile's f32 arithmetic otherwise.
  enum class Rounding { kF32, kHalf, kBf16Pairs };
  struct Tile {
    DType dtype;
    const FusedTileKernel* kernel;
    Rounding rounding;
  };
  std::vector<Tile> tiles;
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8}) {
    tiles.push_back({dtype, Avx512WideDecode(dtype), Rounding::kF32});
  }
  if (HasAvx512Fp16()) {
    for (DType dtype : {DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8}) {
      tiles.push_back({dtype, Avx512Fp16Decode(dtype), Rounding::kHalf});
    }
  }
  if (HasAvx512Bf16()) {
    for (DType dtype : {DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2}) {
      tiles.push_back({dtype, Avx512Bf16Decode(dtype), Rounding::kBf16Pairs});
    }
  }
  for (const auto [dtype, kernel_ptr, rounding] : tiles) {
    const FusedTileKernel& kernel = *kernel_ptr;
    const bool half = rounding == Rounding::kHalf;
    // Loops that scale e4m3fn see its values times 2^-8 (kE4M3Rescale).
    const double stored = dtype == DType::kF8E4M3FN && kernel.e4m3_scaled ? 1.0 / 256.0 : 1.0;
    for (int64_t head_dim : {int64_t{5}, int64_t{64}, int64_t{128}, int64_t{200}, int64_t{256}}) {
      for (int64_t tokens : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{17}, kFusedMaxKeys}) {
        for (bool fresh : {true, false}) {
          const int64_t pad = RoundUp(head_dim, 32);
          const int64_t elem = static_cast<int64_t>(SizeOf(dtype));
          // K rows, then V rows, in one buffer: V row i is K row i's
          // pointer plus v_offset, as a page's other kv heads are.
          const int64_t v_offset = tokens * head_dim * elem;
          std::vector<uint8_t> kv(2 * v_offset);
          for (int64_t i = 0; i < 2 * tokens * head_dim; ++i) {
            StoreFromF32(dtype, kv.data(), i, normal(rng));
          }
          const uint8_t* k = kv.data();
          const uint8_t* v = kv.data() + v_offset;
          const std::vector<const uint8_t*> key_rows = RowPointers(k, tokens, head_dim * elem);
          const KvTile tile = TestTile(dtype, head_dim, key_rows, v_offset, tokens, true);
          auto acc_index = [&](int64_t d) { return AccIndex(kernel.acc_order, d); };
          std::vector<float> q(kRows * pad, 0.0f);
          std::vector<float> m(kRows), l(kRows), acc(kRows * pad, 0.0f);
          for (int64_t r = 0; r < kRows; ++r) {
            for (int64_t d = 0; d < head_dim; ++d) {
              q[r * pad + d] = normal(rng);
              // The bf16 kernels take bf16 q (dispatch gives them no other).
              if (rounding == Rounding::kBf16Pairs) q[r * pad + d] = F32FromBF16(BF16FromF32(q[r * pad + d]));
              if (!fresh) acc[r * pad + acc_index(d)] = normal(rng);
            }
            m[r] = fresh ? -std::numeric_limits<float>::infinity() : normal(rng);
            l[r] = fresh ? 0.0f : 1.0f + std::fabs(normal(rng));
          }
          // The f16 tile leaves tiles whose largest |logit| passes kHalfMaxLogit
          // to f32: its logits stay below it here.
          const float scale = half ? 0.05f : 0.3f;
          rows = rows % kRows + 1;
          std::vector<float> m_out = m, l_out = l, acc_out = acc;
          const SoftmaxState state{m_out.data(), l_out.data(), acc_out.data(), pad};
          // q in the kernel's format, through its own prepare_q.
          const int64_t q_stride = QueryStride(kernel.q_format, pad);
          const int64_t q_row_bytes = q_stride * QueryElemBytes(kernel.q_format);
          std::vector<uint8_t> q_formatted(kRows * q_row_bytes);
          std::vector<float> unscale(kRows);
          for (int64_t r = 0; r < kRows; ++r) {
            unscale[r] = kernel.prepare_q(&q[r * pad], head_dim, pad,
                                          q_formatted.data() + r * q_row_bytes);
          }
          ASSERT_TRUE(kernel.tile(QueryRows{q_formatted.data(), q_stride, rows, unscale.data()},
                                  tile, scale, state));
          const std::string where = std::string(kernel.name) + " " + std::string(ToString(dtype)) +
                                    " head_dim " +
                                    std::to_string(head_dim) + " tokens " +
                                    std::to_string(tokens) + " rows " + std::to_string(rows) +
                                    (fresh ? " fresh" : " running");
          for (int64_t r = rows; r < kRows; ++r) {
            EXPECT_EQ(std::memcmp(&m_out[r], &m[r], sizeof(float)), 0) << where;
            EXPECT_EQ(l_out[r], l[r]) << where;
            EXPECT_EQ(std::memcmp(&acc_out[r * pad], &acc[r * pad], sizeof(float) * pad), 0)
                << where;
          }
          for (int64_t r = 0; r < rows; ++r) {
            std::vector<double> z(tokens);
            double m_new = m[r], z_error = 0.0;
            for (int64_t t = 0; t < tokens; ++t) {
              double dot = 0.0, magnitude = 0.0;
              for (int64_t d = 0; d < head_dim; ++d) {
                const double term =
                    double{q[r * pad + d]} * LoadAsF32(dtype, k, t * head_dim + d) * stored;
                dot += term;
                magnitude += std::fabs(term);
              }
              z[t] = scale * dot;
              if (half) z_error = std::max(z_error, 0x1p-8 * scale * magnitude);
              m_new = std::max(m_new, z[t]);
            }
            // Relative error of a weight: its logit's and m's, and (half) its
            // f16 rounding; the pairs' PV takes weights rounded to bf16, l
            // sums them unrounded.
            const double l_error = 2.0 * z_error + (half ? 0x1p-8 : 1e-5);
            const double p_error = rounding == Rounding::kBf16Pairs ? 0x1p-8 : l_error;
            const double alpha = fresh ? 0.0 : std::exp(m[r] - m_new);
            double l_new = l[r] * alpha;
            for (int64_t t = 0; t < tokens; ++t) l_new += std::exp(z[t] - m_new);
            EXPECT_NEAR(m_out[r], m_new, z_error + 1e-5 * (1.0 + std::fabs(m_new))) << where;
            EXPECT_NEAR(l_out[r], l_new, l_error * l_new) << where;
            for (int64_t d = 0; d < head_dim; ++d) {
              double want = acc[r * pad + acc_index(d)] * alpha;
              double mass = std::fabs(want);
              for (int64_t t = 0; t < tokens; ++t) {
                const double pv =
                    std::exp(z[t] - m_new) * LoadAsF32(dtype, v, t * head_dim + d) * stored;
                want += pv;
                mass += std::fabs(pv);
              }
              EXPECT_NEAR(acc_out[r * pad + acc_index(d)], want, p_error * mass + 1e-6)
                  << where << " row " << r << " dim " << d;
            }
          }
        }
      }
    }
  }
}

// Where SoftmaxRow's special cases apply (a NaN logit or state, an infinite
// maximum) avx512_wide_decode declines and leaves the state bit-identical.
TEST(KernelWideTest, DecodeTileDeclinesNonFinite) {
  if (!HasAvx512Bw()) GTEST_SKIP() << "no AVX-512 BW on this CPU";
  constexpr int64_t kRows = 4, kDim = 64, kTokens = 9;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Variant {
    const char* name;
    float key_value;  // Written into dimension 3 of key 5, or of every key.
    bool every_key;
    float m0;  // Row 0's running max.
  };
  for (const Variant& variant :
       {Variant{"NaN key", nan, false, 0.0f}, Variant{"+inf key", inf, false, 0.0f},
        Variant{"-inf keys, no key seen yet", -inf, true, -inf},
        Variant{"NaN state", 1.0f, false, nan}}) {
    std::vector<uint16_t> k(kTokens * kDim, BF16FromF32(0.5f).bits), v = k;
    for (int64_t t = variant.every_key ? 0 : 5; t < (variant.every_key ? kTokens : 6); ++t) {
      k[t * kDim + 3] = BF16FromF32(variant.key_value).bits;
    }
    const std::vector<const uint8_t*> k_rows =
        RowPointers(reinterpret_cast<const uint8_t*>(k.data()), kTokens, kDim * 2);
    KvTile tile = TestTile(DType::kBF16, kDim, k_rows, 0, kTokens);
    const std::vector<const uint8_t*> v_rows =
        RowPointers(reinterpret_cast<const uint8_t*>(v.data()), kTokens, kDim * 2);
    tile.v = {v_rows.data(), 0, kTokens};
    std::vector<float> q(kRows * kDim, 1.0f), m(kRows, 0.0f), l(kRows, 1.0f),
        acc(kRows * kDim, 2.0f);
    m[0] = variant.m0;
    const std::vector<float> m_before = m, l_before = l, acc_before = acc;
    EXPECT_FALSE(Avx512WideDecode(DType::kBF16)
                     ->tile(QueryRows{q.data(), kDim, kRows, nullptr}, tile, 1.0f,
                            SoftmaxState{m.data(), l.data(), acc.data(), kDim}))
        << variant.name;
    EXPECT_EQ(std::memcmp(m.data(), m_before.data(), sizeof(float) * kRows), 0) << variant.name;
    EXPECT_EQ(l, l_before) << variant.name;
    EXPECT_EQ(acc, acc_before) << variant.name;
  }
}

// avx512fp16_decode would turn e4m3fn's NaN codes (0x7F, 0xFF) into finite
// f16, and e5m2's NaN and inf codes reach the sums, so it looks at the
// codes: one in a K row, or in a V row past the first 128-dim pass (which
// writes acc first), makes it decline with the state bit-identical; so does
// a tile whose largest logit is far from 0 (f16 would round it too much).
TEST(KernelWideTest, HalfDecodeTileDeclines) {
  if (!HasAvx512Fp16()) GTEST_SKIP() << "no AVX512-FP16 on this CPU";
  constexpr int64_t kRows = 4, kDim = 256, kTokens = 9;
  struct Variant {
    DType dtype;
    uint8_t code;
  };
  for (const bool in_v : {false, true}) {
    for (const Variant variant :
         {Variant{DType::kF8E4M3FN, 0x7F}, Variant{DType::kF8E4M3FN, 0xFF},
          Variant{DType::kF8E5M2, 0x7C}, Variant{DType::kF8E5M2, 0xFC},
          Variant{DType::kF8E5M2, 0x7E}, Variant{DType::kF8E5M2, 0xFF}}) {
      std::vector<uint8_t> k(kTokens * kDim, 0x30), v = k;  // 0.5 in e4m3fn, 0.125 in e5m2.
      (in_v ? v : k)[5 * kDim + 200] = variant.code;
      const std::vector<const uint8_t*> k_rows = RowPointers(k.data(), kTokens, kDim);
      const std::vector<const uint8_t*> v_rows = RowPointers(v.data(), kTokens, kDim);
      KvTile tile = TestTile(variant.dtype, kDim, k_rows, 0, kTokens);
      tile.v = {v_rows.data(), 0, kTokens};
      const FusedTileKernel& half = *Avx512Fp16Decode(variant.dtype);
      std::vector<float> q(kDim, 1.0f), m(kRows, 0.0f), l(kRows, 1.0f), acc(kRows * kDim, 2.0f);
      std::vector<uint16_t> q_half(kRows * kDim);
      std::vector<float> unscale(kRows);
      for (int64_t r = 0; r < kRows; ++r) {
        unscale[r] = half.prepare_q(q.data(), kDim, kDim, &q_half[r * kDim]);
      }
      const std::vector<float> m_before = m, l_before = l, acc_before = acc;
      const std::string where = std::string(ToString(variant.dtype)) + (in_v ? " V" : " K") +
                                " code " + std::to_string(variant.code);
      EXPECT_FALSE(half.tile(QueryRows{q_half.data(), kDim, kRows, unscale.data()}, tile, 1.0f,
                             SoftmaxState{m.data(), l.data(), acc.data(), kDim}))
          << where;
      EXPECT_EQ(m, m_before) << where;
      EXPECT_EQ(l, l_before) << where;
      EXPECT_EQ(acc, acc_before) << where;
    }
  }
  // All codes 0.5 (e4m3fn, stored as 2^-9) and q 1: logits 256 * 2^-9 * scale.
  for (const float logit : {16.5f, -16.5f}) {
    std::vector<uint8_t> kv(kTokens * kDim, 0x30);
    const std::vector<const uint8_t*> rows = RowPointers(kv.data(), kTokens, kDim);
    const KvTile tile = TestTile(DType::kF8E4M3FN, kDim, rows, 0, kTokens);
    const FusedTileKernel& half = *Avx512Fp16Decode(DType::kF8E4M3FN);
    std::vector<float> q(kDim, 1.0f), m(kRows, 0.0f), l(kRows, 1.0f), acc(kRows * kDim, 2.0f);
    std::vector<uint16_t> q_half(kRows * kDim);
    std::vector<float> unscale(kRows);
    for (int64_t r = 0; r < kRows; ++r) {
      unscale[r] = half.prepare_q(q.data(), kDim, kDim, &q_half[r * kDim]);
    }
    const std::vector<float> m_before = m, l_before = l, acc_before = acc;
    EXPECT_FALSE(half.tile(QueryRows{q_half.data(), kDim, kRows, unscale.data()}, tile,
                           logit * 2.0f, SoftmaxState{m.data(), l.data(), acc.data(), kDim}))
        << logit;
    EXPECT_EQ(m, m_before);
    EXPECT_EQ(l, l_before);
    EXPECT_EQ(acc, acc_before);
  }
}

// The largest codes, everywhere: no f16 sum overflows, so the tile does not
// decline and matches the f32 tile.
TEST(KernelWideTest, HalfDecodeTileTakesTheLargestCodes) {
  if (!HasAvx512Fp16()) GTEST_SKIP() << "no AVX512-FP16 on this CPU";
  constexpr int64_t kRows = 4, kDim = 256, kTokens = 32;
  // The logit scales keep the logits (1.3 and 4.4) below kHalfMaxLogit.
  for (const auto& [dtype, largest, scale] :
       {std::tuple{DType::kF8E4M3FN, uint8_t{0x7E}, 1e-3f},
        std::tuple{DType::kF8E5M2, uint8_t{0x7B}, 1e-7f}}) {
    std::vector<uint8_t> kv(kTokens * kDim, largest);
    const std::vector<const uint8_t*> rows = RowPointers(kv.data(), kTokens, kDim);
    const KvTile tile = TestTile(dtype, kDim, rows, 0, kTokens);
    const FusedTileKernel& half = *Avx512Fp16Decode(dtype);
    std::vector<float> q(kDim, 3.0f), q_eo(kDim, 3.0f);
    std::vector<uint16_t> q_half(kRows * kDim);
    std::vector<float> unscale(kRows);
    for (int64_t r = 0; r < kRows; ++r) {
      unscale[r] = half.prepare_q(q.data(), kDim, kDim, &q_half[r * kDim]);
    }
    std::vector<float> m(kRows, -std::numeric_limits<float>::infinity()), l(kRows, 0.0f);
    std::vector<float> acc(kRows * kDim, 0.0f);
    std::vector<float> m_wide = m, l_wide = l, acc_wide = acc;
    ASSERT_TRUE(half.tile(QueryRows{q_half.data(), kDim, kRows, unscale.data()}, tile, scale,
                          SoftmaxState{m.data(), l.data(), acc.data(), kDim}))
        << ToString(dtype);
    ASSERT_TRUE(Avx512WideDecode(dtype)->tile(QueryRows{q_eo.data(), 0, kRows, nullptr}, tile,
                                              scale,
                                              SoftmaxState{m_wide.data(), l_wide.data(),
                                                           acc_wide.data(), kDim}));
    for (int64_t r = 0; r < kRows; ++r) {
      EXPECT_NEAR(m[r], m_wide[r], 4e-3 * std::fabs(m_wide[r])) << ToString(dtype);
      EXPECT_NEAR(l[r], l_wide[r], 1e-3 * l_wide[r]) << ToString(dtype);
      for (int64_t d = 0; d < kDim; ++d) {
        EXPECT_NEAR(acc[r * kDim + d], acc_wide[r * kDim + d],
                    4e-3 * std::fabs(acc_wide[r * kDim + d]))
            << ToString(dtype) << " row " << r << " dim " << d;
      }
    }
  }
}

#endif  // __x86_64__

// The kernels a call reports for each class of task under each feature
// mask, against the dispatch table written out in dispatch.h (what the
// grids above then check numerically under the same masks).
// docs/dispatch.md's table is DispatchTable(), the records' own choice for
// every dtype, class and kind of CPU: a record added, removed or reordered
// without the doc fails here. RPA_WRITE_DISPATCH_TABLE=1 rewrites the doc.
TEST(KernelDispatchTest, DocsTableIsTheRecords) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "the table's columns are x86-64 CPUs";
#endif
  const std::string path = std::string(RPA_SOURCE_DIR) + "/docs/dispatch.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string begin = "<!-- generated by DispatchTable(): -->\n", end = "<!-- end -->";
  const size_t from = doc.find(begin), to = doc.find(end);
  ASSERT_TRUE(from != std::string::npos && to != std::string::npos && from < to) << path;
  const std::string table = DispatchTable();
  if (std::getenv("RPA_WRITE_DISPATCH_TABLE") != nullptr) {
    std::ofstream(path) << doc.substr(0, from + begin.size()) << table << doc.substr(to);
    return;
  }
  EXPECT_EQ(doc.substr(from + begin.size(), to - from - begin.size()), table)
      << path << " is not the records' table; rewrite it with RPA_WRITE_DISPATCH_TABLE=1 "
      << "build/tests/rpa_tests --gtest_filter=KernelDispatchTest.DocsTableIsTheRecords";
}

TEST(KernelDispatchTest, ReportsTheTableRow) {
  auto report = [](DType kv, std::vector<SequenceShape> seqs, bool soft_cap,
                   DType q = DType::kF32) {
    BatchSpec spec;
    spec.q_dtype = q;
    spec.kv_dtype = kv;
    spec.num_q_heads = 8;
    spec.num_kv_heads = 2;
    spec.sequences = std::move(seqs);
    const SyntheticBatch b = testing::MakeSyntheticBatch(spec);
    std::vector<uint8_t> out = b.NewOutput();
    AttentionOptions o;
    o.sm_scale = 0.1;
    o.num_queries_per_block = 16;  // Prefill tiles: 16 tokens x 4 q heads per kv head.
    if (soft_cap) o.soft_cap = 30.0;
    return DescribeKernels(ValidateRagged(
        CombinedInputs(b.Q(), b.KvPages(),
                       PageTable{b.KvLens(), b.PageIndices(), b.CuQLens(), b.NumSeqs()}),
        o, b.OutView(out)));
  };
  const std::vector<SequenceShape> decode = {{1, 40}}, middle = {{3, 40}},
                                   prefill = {{40, 40}};
  {
    ScopedCpuFeatureMask portable(kNoCpuFeatures);
    EXPECT_EQ(report(DType::kBF16, decode, false), "decode: highway_rows");
    EXPECT_EQ(report(DType::kF8E4M3FN, middle, false), "middle: highway_rows");
    EXPECT_EQ(report(DType::kBF16, prefill, false), "prefill: highway_packed");
  }
  EXPECT_EQ(report(DType::kF32, decode, false), "decode: highway_rows");
  EXPECT_EQ(report(DType::kF16, prefill, false), "prefill: highway_packed");
  EXPECT_EQ(report(DType::kF32, middle, false), "middle: highway_rows");
  if (DetectedCpuFeatures().avx512bf16) {
    // AMD's rules, on any CPU with AVX-512 BF16; AMX hidden.
    ScopedCpuRules zen5(CpuRules::kZen5);
    testing::ScopedWithoutAmx hide_amx;
    EXPECT_EQ(report(DType::kBF16, prefill, false, DType::kBF16), "prefill: avx512_bf16_packed");
    EXPECT_EQ(report(DType::kF8E5M2, prefill, true, DType::kBF16), "prefill: avx512_bf16_packed");
    EXPECT_EQ(report(DType::kBF16, decode, false, DType::kBF16),
              "decode: avx512_bf16_decode > avx512_bf16_rows");
    EXPECT_EQ(report(DType::kF8E4M3FN, decode, false, DType::kBF16),
              "decode: avx512_bf16_decode > avx512_bf16_rows");
    EXPECT_EQ(report(DType::kBF16, decode, true, DType::kBF16), "decode: avx512_bf16_rows");
    EXPECT_EQ(report(DType::kBF16, middle, false, DType::kBF16),
              "middle: avx512_bf16_lanes_tile > avx512_bf16_lanes");
    EXPECT_EQ(report(DType::kBF16, middle, true, DType::kBF16), "middle: avx512_bf16_lanes");
    EXPECT_EQ(report(DType::kF8E5M2, middle, false, DType::kBF16),
              "middle: avx512_bf16_lanes_tile > avx512_bf16_lanes");
    EXPECT_EQ(report(DType::kI8, middle, true, DType::kBF16), "middle: avx512_bf16_lanes");
    EXPECT_EQ(report(DType::kI8, decode, false, DType::kBF16),
              "decode: avx512_bf16_decode > avx512_bf16_rows");
    // Not exact in bf16: the widening path.
    EXPECT_EQ(report(DType::kF16, decode, false, DType::kBF16),
              "decode: avx512_wide_decode > avx512_wide");
    EXPECT_EQ(report(DType::kBF16, decode, false, DType::kF32),
              "decode: avx512_wide_decode > avx512_wide");
    ScopedCpuFeatureMask mask(SlowBf16Dot());
    EXPECT_EQ(report(DType::kBF16, prefill, false, DType::kBF16), "prefill: highway_packed");
    EXPECT_EQ(report(DType::kBF16, decode, false, DType::kBF16),
              "decode: avx512_wide_decode > avx512_wide");
    EXPECT_EQ(report(DType::kBF16, middle, false, DType::kBF16), "middle: avx512_wide");
    {
      // int8 takes the bf16 pairs where vdpbf16ps is slow too, but not where
      // AVX512-FP16 gives it the f16 tile (below).
      ScopedCpuFeatureMask no_fp16(CpuFeatures{.avx512bw = true, .avx512bf16 = true});
      EXPECT_EQ(report(DType::kI8, decode, false, DType::kBF16),
                "decode: avx512_bf16_decode > avx512_bf16_rows");
      EXPECT_EQ(report(DType::kI8, middle, false, DType::kBF16), "middle: avx512_bf16_rows");
    }
  }
  if (DetectedCpuFeatures().avx512bf16) {
    testing::ScopedAmxEmulation emulate;
    EXPECT_EQ(report(DType::kBF16, prefill, false, DType::kBF16),
              "prefill: amx_prefill (emulated)");
    EXPECT_EQ(report(DType::kI8, prefill, false, DType::kBF16),
              "prefill: amx_prefill (emulated)");
    EXPECT_EQ(report(DType::kBF16, prefill, false, DType::kF32), "prefill: highway_packed");
    EXPECT_EQ(report(DType::kF16, prefill, false, DType::kBF16), "prefill: highway_packed");
  }
  if (!DetectedCpuFeatures().avx512bw) GTEST_SKIP() << "no AVX-512 BW on this CPU";
  EXPECT_EQ(report(DType::kBF16, decode, false), "decode: avx512_wide_decode > avx512_wide");
  EXPECT_EQ(report(DType::kBF16, decode, true), "decode: avx512_wide");
  EXPECT_EQ(report(DType::kBF16, middle, false), "middle: avx512_wide");
  EXPECT_EQ(report(DType::kF16, decode, false), "decode: avx512_wide_decode > avx512_wide");
  EXPECT_EQ(report(DType::kF16, middle, false), "middle: avx512_wide");
  EXPECT_EQ(report(DType::kI8, middle, false), "middle: avx512_wide");
  EXPECT_EQ(report(DType::kF8E5M2, prefill, false), "prefill: highway_packed");
  EXPECT_EQ(report(DType::kBF16, {{1, 40}, {40, 40}}, false),
            "decode: avx512_wide_decode > avx512_wide; prefill: highway_packed");
  {
    ScopedCpuFeatureMask no_f16(CpuFeatures{.avx512bw = true, .avx512bf16 = true});
    EXPECT_EQ(report(DType::kF8E4M3FN, decode, false),
              "decode: avx512_wide_decode > avx512_wide");
    EXPECT_EQ(report(DType::kI8, decode, false), "decode: avx512_wide_decode > avx512_wide");
    // More rows per kv head than a decode tile: each 8-bit tile converted once.
    EXPECT_EQ(report(DType::kF8E4M3FN, middle, false), "middle: avx512_wide_fp8_scratch");
    EXPECT_EQ(report(DType::kF8E5M2, middle, true), "middle: avx512_wide_fp8_scratch");
  }
  if (!DetectedCpuFeatures().avx512fp16) GTEST_SKIP() << "no AVX512-FP16 on this CPU";
  EXPECT_EQ(report(DType::kF8E4M3FN, decode, false),
            "decode: avx512fp16_decode > avx512_wide_decode > avx512_wide");
  EXPECT_EQ(report(DType::kI8, decode, false),
            "decode: avx512fp16_decode > avx512_wide_decode > avx512_wide");
  EXPECT_EQ(report(DType::kI8, decode, false, DType::kBF16),
            "decode: avx512fp16_decode > avx512_wide_decode > avx512_wide");
  EXPECT_EQ(report(DType::kF8E5M2, decode, true), "decode: avx512_wide");
}

// Every kernel record is reachable: on this CPU (AMX through its tile
// model), some call of its dtypes and classes under some feature mask
// dispatches it, under its own name; a record whose CPU needs this machine
// lacks is counted and skipped. The masks: all features, a slow vdpbf16ps
// (the Intel machines), AVX-512 BW + FP16, AVX-512 BW only, none.
TEST(KernelDispatchTest, EveryRecordIsReachable) {
  const std::vector<CpuFeatures> masks = {
      kAllCpuFeatures, SlowBf16Dot(), CpuFeatures{.avx512bw = true, .avx512fp16 = true},
      CpuFeatures{.avx512bw = true}, kNoCpuFeatures};
  const DType q_dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  const DType kv_dtypes[] = {DType::kF32,      DType::kBF16,   DType::kF16,
                             DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8};
  int reached = 0, unreachable_here = 0;
  { testing::ScopedAmxEmulation install; }  // Its record joins the list (testing/).
  for (const KernelRecord& record : KernelRecords()) {
    ASSERT_TRUE((record.products != nullptr) != (record.fused != nullptr)) << record.name;
    bool found = false, cpu_ever = false;
    for (int m = 0; m < 2 * static_cast<int>(masks.size()); ++m) {
      // Each mask without, then with, the tile model.
      std::optional<testing::ScopedAmxEmulation> emulate;
      if (m % 2 == 1 && DetectedCpuFeatures().avx512bf16) emulate.emplace();
      ScopedCpuFeatureMask scoped(masks[m / 2]);
      const CpuFeatures cpu = UsableCpuFeatures();
      for (DType q : q_dtypes) {
        for (DType kv : kv_dtypes) {
          cpu_ever = cpu_ever || record.needs.cpu == nullptr || record.needs.cpu(cpu, kv);
          for (int c = 0; c < kNumTaskClasses && !found; ++c) {
            AttentionProblem problem;
            problem.q_dtype = q;
            problem.kv_dtype = kv;
            const KernelChoice choice = ChooseKernels(problem, cpu);
            const TaskKernels& chosen = choice.For(static_cast<TaskClass>(c));
            const std::string described = chosen.Describe();
            if (record.products != nullptr) {
              found = chosen.products == record.products(kv);
            } else {
              const FusedTileKernel* tile = record.fused(kv);  // Null: not of its dtypes.
              found = tile != nullptr && (chosen.fused[0] == tile || chosen.fused[1] == tile);
            }
            if (found) {
              EXPECT_NE(described.find(record.name), std::string::npos) << described;
              EXPECT_TRUE(Meets(record, problem, static_cast<TaskClass>(c), cpu)) << record.name;
            }
          }
        }
      }
    }
    if (!cpu_ever) {
      ++unreachable_here;  // E.g. AVX512-FP16 on an AMD CPU: its test runs where it exists.
      continue;
    }
    EXPECT_TRUE(found) << record.name << " (" << record.file << ") is never dispatched";
    reached += found ? 1 : 0;
  }
  EXPECT_GE(reached, 2);  // highway_rows and highway_packed, on every CPU.
  RecordProperty("records_unreachable_on_this_cpu", unreachable_here);
}

// A record's kernel has an instance for each K/V dtype its needs name and
// none for the others, every instance under the record's name: dispatch
// takes the instance once per plan, and the table's rows read the name.
TEST(KernelDispatchTest, EveryRecordHasAnInstancePerDtype) {
  for (const KernelRecord& record : KernelRecords()) {
    for (DType kv : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3FN, DType::kF8E5M2,
                     DType::kI8}) {
      const bool taken = ((record.needs.kv_dtypes >> static_cast<int>(kv)) & 1u) != 0;
      const ProductKernel* products = record.products ? record.products(kv) : nullptr;
      const FusedTileKernel* tile = record.fused ? record.fused(kv) : nullptr;
      const char* name = products ? products->name : tile ? tile->name : nullptr;
      EXPECT_EQ(name != nullptr, taken) << record.name << " " << ToString(kv);
      if (name != nullptr) {
        EXPECT_STREQ(name, record.name) << ToString(kv);
      }
    }
  }
}

// The public description names the features, AMX's status and each class's
// rows and kernels, as dispatch chooses them on this thread.
TEST(KernelDispatchTest, DescribeKernelsNamesEveryClass) {
  const std::string all = rpa::DescribeKernels(DType::kBF16);
  EXPECT_NE(all.find("cpu features: " + DetectedCpuFeatures().ToString()), std::string::npos)
      << all;
  EXPECT_NE(all.find("amx: " + AmxDetection()), std::string::npos) << all;
  for (const std::string& c : {"decode (<= " + std::to_string(kDecodeMaxRows) + " rows): ",
                              "middle (" + std::to_string(kDecodeMaxRows + 1) + "-" +
                                  std::to_string(kPackedMinRows - 1) + " rows): ",
                              "prefill (>= " + std::to_string(kPackedMinRows) + " rows): "}) {
    EXPECT_NE(all.find(c), std::string::npos) << all;
  }
  {
    ScopedCpuFeatureMask portable(kNoCpuFeatures);
    EXPECT_NE(rpa::DescribeKernels(DType::kBF16).find("rows): highway_packed"), std::string::npos);
  }
  if (!DetectedCpuFeatures().avx512bf16) return;
  testing::ScopedAmxEmulation emulate;
  EXPECT_NE(rpa::DescribeKernels(DType::kBF16).find("rows): amx_prefill (emulated)"),
            std::string::npos)
      << rpa::DescribeKernels(DType::kBF16);
}

// A feature mask is scoped and per thread: it ends with its scope and never
// reaches another thread's calls.
TEST(KernelDispatchTest, FeatureMasksAreScopedAndPerThread) {
  const CpuFeatures all = DetectedCpuFeatures();
  {
    ScopedCpuFeatureMask outer(CpuFeatures{.avx512bw = true});
    EXPECT_FALSE(UsableCpuFeatures().avx512fp16);
    EXPECT_EQ(UsableCpuFeatures().avx512bw, all.avx512bw);
    {
      ScopedCpuFeatureMask inner(kNoCpuFeatures);
      EXPECT_FALSE(UsableCpuFeatures().avx512bw);
      CpuFeatures other;
      std::thread([&] { other = UsableCpuFeatures(); }).join();
      EXPECT_EQ(other.ToString(), all.ToString());
    }
    EXPECT_EQ(UsableCpuFeatures().avx512bw, all.avx512bw);
  }
  EXPECT_EQ(UsableCpuFeatures().ToString(), all.ToString());
}

// ---- Shapes the random grid may miss.
Case Fixed(std::vector<SequenceShape> seqs, DType kv, int threads) {
  Case c;
  c.spec.num_q_heads = 8;
  c.spec.num_kv_heads = 2;
  c.spec.head_dim = 40;
  c.spec.page_size = 5;
  c.spec.q_dtype = DType::kF32;
  c.spec.kv_dtype = kv;
  c.spec.sequences = std::move(seqs);
  c.spec.max_num_batched_tokens = 0;
  c.threads = threads;
  return c;
}

void CheckCase(const Case& c) {
  const SyntheticBatch b = testing::MakeSyntheticBatch(c.spec);
  ExpectClose(c, b, RunCase(c, b, true), RunCase(c, b, false));
}

TEST(KernelTest, EmptyAndDegenerateBatches) {
  for (int threads = 1; threads <= 4; ++threads) {
    CheckCase(Fixed({}, DType::kF32, threads));                        // num_seqs 0.
    CheckCase(Fixed({{0, 0}, {0, 9}, {1, 1}}, DType::kF32, threads));  // q_len 0, kv_len 0.
    Case padded = Fixed({{2, 7}}, DType::kBF16, threads);
    padded.spec.max_num_batched_tokens = 6;  // Padding rows after the sequence.
    padded.lse = true;
    CheckCase(padded);
  }
}

// One long decode sequence: the plan must split it over the threads and the
// log-sum-exp merge must agree with the reference.
TEST(KernelTest, LongDecodeSplitsAndMerges) {
  for (int threads = 2; threads <= 4; ++threads) {
    for (DType kv : {DType::kF32, DType::kBF16}) {
      Case c = Fixed({{1, 3000}}, kv, threads);
      c.spec.num_kv_heads = 1;
      c.spec.num_q_heads = 4;
      c.lse = true;
      c.sinks = true;
      CheckCase(c);
    }
  }
}

// JAX's paged_attention with length 0 asks for one query over no keys: the
// row is 0, not NaN.
TEST(KernelTest, QueryWithoutKeysIsZero) {
  std::vector<float> q(2 * 4 * 8, 1.0f), k(2 * 3 * 4 * 8, NAN), v(k.size(), NAN);
  std::vector<int32_t> lengths = {0, 0};
  std::vector<int32_t> pages = {0, 1, 2, 0, 1, 2};
  std::vector<float> out(q.size(), 7.0f);
  PagedAttentionOptions options;
  std::vector<int32_t> storage;
  AttentionProblem p = StaticValidatePagedAttention(
      TensorView(q.data(), DType::kF32, {2, 4, 8}),
      TensorView(k.data(), DType::kF32, {2, 3, 4, 8}),
      TensorView(v.data(), DType::kF32, {2, 3, 4, 8}),
      TensorView(lengths.data(), DType::kI32, {2}), TensorView(pages.data(), DType::kI32, {2, 3}),
      options, MutableTensorView(out.data(), DType::kF32, {2, 4, 8}), storage);
  DynamicValidate(2, p, kPagedAttentionNames);
  ComputeAttention(p);
  for (float x : out) EXPECT_EQ(x, 0.0f);
}

// bf16 K/V decode with a NaN or an infinite K element mid-tile (key 45:
// tile 32-63): the fused tile declines there and the products take the rest
// of the tile, so the head's rows are NaN (or what the infinity gives) like
// the reference's, and the other heads' rows are as without it. 3, 4 and 8
// q heads per kv head (8: two fused groups per head), 12 and 16 (the middle
// class: on a fast-dot CPU avx512_bf16_lanes_tile, 12 with padding lanes), a
// tile ending mid-way (kv_len 70), 1-3 threads (split-KV merges).
TEST(KernelTest, DecodeDeclinesMidTileLikeTheReference) {
  for (const int64_t group : {int64_t{3}, int64_t{4}, int64_t{8}, int64_t{12}, int64_t{16}}) {
    for (const float bad : {NAN, INFINITY, -INFINITY}) {
      for (int threads = 1; threads <= 3; ++threads) {
        Case c = Fixed({{1, 70}, {1, 37}, {1, 5}}, DType::kBF16, threads);
        c.spec.q_dtype = DType::kBF16;
        c.spec.num_kv_heads = 4;
        c.spec.num_q_heads = 4 * group;
        c.spec.head_dim = 64;
        c.spec.page_size = 16;
        c.lse = true;
        SyntheticBatch b = testing::MakeSyntheticBatch(c.spec);
        // Key 45 of sequence 0, kv head 2, dim 3.
        const int64_t page = b.page_indices[45 / 16];
        const int64_t element =
            ((page * 16 + 45 % 16) * 2 * c.spec.num_kv_heads + 2 * 2) * c.spec.head_dim + 3;
        StoreFromF32(DType::kBF16, b.kv_pages.data(), element, bad);
        SCOPED_TRACE(::testing::Message() << "K element " << bad << " at key 45");
        ExpectClose(c, b, RunCase(c, b, true), RunCase(c, b, false), NonFinite::kLikeReference);
      }
    }
  }
}

// The lazy softmax fused into a bf16-pair kernel's logits
// (ProductKernel::weights, lazy_softmax_bf16.h) where its reference must
// rise mid-tile (logits that grow with the key, so a later 32-key block
// passes the reference by more than its lag and the row's earlier weights
// are rescaled) and where it declines to the unfused path (a NaN, +inf or
// -inf K element at key 100, the fourth 32-key block of the first tile,
// which every row sees; a window, whose masked keys before a row's first it
// does not take). Prefill tiles of 128 keys (four blocks), the causal
// diagonal inside them, 1-3 threads.
void CheckFusedSoftmaxEdges() {
  enum class Edit { kRising, kNaN, kInf, kNegInf, kWindow };
  for (const Edit edit : {Edit::kRising, Edit::kNaN, Edit::kInf, Edit::kNegInf, Edit::kWindow}) {
    for (int threads = 1; threads <= 3; ++threads) {
      Case c = Fixed({{48, 300}, {40, 40}, {33, 100}}, DType::kBF16, threads);
      c.spec.q_dtype = DType::kBF16;
      c.spec.num_kv_heads = 2;
      c.spec.num_q_heads = 8;
      c.spec.head_dim = 64;
      c.spec.page_size = 16;
      c.options.num_kv_pages_per_block = 8;
      c.options.num_queries_per_block = 16;
      c.lse = true;
      if (edit == Edit::kWindow) c.options.sliding_window = 70;
      SyntheticBatch b = testing::MakeSyntheticBatch(c.spec);
      // K element d of key t of sequence 0, kv head 1.
      auto k_element = [&](int64_t t, int64_t d) {
        const int64_t page = b.page_indices[t / 16];
        return ((page * 16 + t % 16) * 2 * c.spec.num_kv_heads + 2 * 1) * c.spec.head_dim + d;
      };
      const DType kv = c.spec.kv_dtype;
      if (edit == Edit::kRising) {
        for (int64_t t = 0; t < 300; ++t) {
          for (int64_t d = 0; d < c.spec.head_dim; ++d) {
            const int64_t e = k_element(t, d);
            const float grown = LoadAsF32(kv, b.kv_pages.data(), e) * (1.0f + 0.1f * t);
            StoreFromF32(kv, b.kv_pages.data(), e, grown);
          }
        }
      } else if (edit != Edit::kWindow) {
        const float bad = edit == Edit::kNaN ? NAN : edit == Edit::kInf ? INFINITY : -INFINITY;
        StoreFromF32(kv, b.kv_pages.data(), k_element(100, 3), bad);  // Every row sees it.
      }
      SCOPED_TRACE(::testing::Message() << "edit " << static_cast<int>(edit) << ", threads "
                                        << threads);
      ExpectClose(c, b, RunCase(c, b, true), RunCase(c, b, false), NonFinite::kLikeReference);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// On avx512_bf16_packed's products in registers (AMD's rules, AMX hidden).
TEST(KernelBf16PackedTest, FusedSoftmaxEdgesMatchReference) {
  if (!DetectedCpuFeatures().avx512bf16) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  ScopedCpuRules zen5(CpuRules::kZen5);
  testing::ScopedWithoutAmx hide_amx;
  CheckFusedSoftmaxEdges();
}

// On amx_prefill's logits stored from the tiles: the tile model, and the
// hardware's tiles where the CPU has them.
TEST(KernelAmxTest, FusedSoftmaxEdgesMatchReference) {
  if (!DetectedCpuFeatures().avx512bf16) GTEST_SKIP() << "the tile model needs AVX-512 BF16";
  {
    testing::ScopedAmxEmulation emulate;
    CheckFusedSoftmaxEdges();
  }
  if (DetectedCpuFeatures().amx_bf16) CheckFusedSoftmaxEdges();
}

// The lanes kernels' edges under AMD's rules, on bf16, 8-bit float and int8
// K/V: heads wider than the fused tile's 256 padded dims (declined to the
// products) and odd ones, 9-31 rows
// per kv head (one and two lane blocks, padded lanes), ragged kv lengths
// that end tiles mid-way, a soft cap (the products alone), 1-4 threads.
TEST(KernelBf16LanesTest, EdgesMatchReference) {
  if (!DetectedCpuFeatures().avx512bf16) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  ScopedCpuRules zen5(CpuRules::kZen5);
  testing::ScopedWithoutAmx hide_amx;
  for (const DType kv : {DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8}) {
    for (const int64_t head_dim : {int64_t{264}, int64_t{257}, int64_t{33}, int64_t{1}}) {
      for (const auto& [tokens, group] : {std::pair{3, 3}, std::pair{4, 4}, std::pair{5, 5},
                                          std::pair{2, 12}, std::pair{1, 31}}) {
        for (int threads : {1, 4}) {
          Case c = Fixed({{tokens, 70}, {tokens, 33}, {tokens, tokens}}, kv, threads);
          c.spec.q_dtype = DType::kBF16;
          c.spec.num_kv_heads = 2;
          c.spec.num_q_heads = 2 * group;
          c.spec.head_dim = head_dim;
          c.spec.page_size = 7;
          c.lse = true;
          if (threads == 4) c.options.soft_cap = 20.0;
          SCOPED_TRACE(::testing::Message() << ToString(kv) << ", head_dim " << head_dim << ", "
                                            << tokens << " tokens x " << group
                                            << " q heads per kv head");
          CheckCase(c);
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

// The lanes kernels read nothing past a K row: with an odd head_dim the last
// pair is one element and a zero, not the next element (in the combined
// cache, the first of the head's V row), here +inf: read, it would make
// every logit NaN instead of one output dimension infinite.
TEST(KernelBf16LanesTest, OddHeadDimReadsNothingPastTheRow) {
  if (!DetectedCpuFeatures().avx512bf16) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  ScopedCpuRules zen5(CpuRules::kZen5);
  testing::ScopedWithoutAmx hide_amx;
  for (const int64_t head_dim : {int64_t{33}, int64_t{1}}) {
    Case c = Fixed({{4, 40}}, DType::kBF16, 1);
    c.spec.q_dtype = DType::kBF16;
    c.spec.num_kv_heads = 2;
    c.spec.num_q_heads = 8;  // 16 rows per kv head: the fused tile, then the products.
    c.spec.head_dim = head_dim;
    c.spec.page_size = 16;
    SyntheticBatch b = testing::MakeSyntheticBatch(c.spec);
    // V of kv head 0, key 10, dim 0.
    const int64_t page = b.page_indices[0];
    const int64_t element = ((page * 16 + 10) * 2 * c.spec.num_kv_heads + 1) * head_dim;
    StoreFromF32(DType::kBF16, b.kv_pages.data(), element, INFINITY);
    SCOPED_TRACE(::testing::Message() << "head_dim " << head_dim);
    ExpectClose(c, b, RunCase(c, b, true), RunCase(c, b, false), NonFinite::kLikeReference);
  }
}

// Every visible logit -inf under mask_value -inf, or every logit -inf under
// an additive mask: the reference's row is exp(-inf - -inf) = NaN (fuzz
// input ragged_inf_key_bf16_path); +inf logits (head 1) too. Split over
// threads (the merge), on each path.
TEST(KernelTest, AllLogitsMinusInfIsNaNLikeTheReference) {
  const int64_t T = 6, D = 8;
  // 2 q heads, 1 kv head; 4 pages of 4 slots of K, V.
  std::vector<float> q(T * 2 * D, 0.5f), kv(4 * 4 * 2 * D, 0.25f);
  for (int64_t t = 0; t < T; ++t) q[(t * 2) * D] = 1.0f;             // Head 0: d 0 positive.
  for (int64_t i = 0; i < 4 * 4; ++i) kv[(i * 2) * D] = -INFINITY;   // Every K: d 0 = -inf.
  for (int64_t t = 0; t < T; ++t) q[(t * 2 + 1) * D] = -1.0f;        // Head 1: +inf logits.
  std::vector<int32_t> kv_lens = {T}, pages = {2, 0, 3, 1}, cu = {0, T}, n = {1};
  for (double mask : {-std::numeric_limits<double>::infinity(), 4.8}) {  // Vanish; additive.
    for (bool portable : {false, true}) {
      std::optional<ScopedCpuFeatureMask> hidden;  // true: the Highway kernels only.
      if (portable) hidden.emplace(kNoCpuFeatures);
      for (int threads : {1, 3}) {
        AttentionOptions o;
        o.mask_value = mask;
        o.num_threads = threads;
        o.num_kv_pages_per_block = 1;
        std::vector<float> out(q.size(), 7.0f), ref(q.size(), 7.0f);
        const TensorView qv(q.data(), DType::kF32, {T, 2, D});
        const TensorView kvv(kv.data(), DType::kF32, {4, 4, 2, D});
        const TensorView lens(kv_lens.data(), DType::kI32, {1});
        const TensorView pi(pages.data(), DType::kI32, {1, 4});
        const TensorView cuv(cu.data(), DType::kI32, {2}), nv(n.data(), DType::kI32, {1});
        RefRaggedPagedAttention(qv, kvv, PageTable{lens, pi, cuv, nv}, o,
                                MutableTensorView(ref.data(), DType::kF32, {T, 2, D}));
        RaggedPagedAttention(qv, kvv, PageTable{lens, pi, cuv, nv}, o,
                             MutableTensorView(out.data(), DType::kF32, {T, 2, D}));
        for (size_t i = 0; i < out.size(); ++i) {
          ASSERT_TRUE(std::isnan(ref[i])) << i;  // Both heads: NaN in the reference.
          EXPECT_TRUE(std::isnan(out[i])) << "flat " << i << " threads " << threads;
        }
      }
    }
  }
}

// Same inputs, same thread count: the same bytes, every run.
TEST(KernelTest, BitIdenticalAcrossRuns) {
  std::mt19937_64 rng(5);
  for (int i = 0; i < 4; ++i) {
    Case c = RandomCase(rng, i % 2 ? DType::kBF16 : DType::kF32);
    c.spec.sequences = {{1, 900}, {37, 300}, {1, 64}};
    c.spec.max_num_seqs = 3;
    c.spec.pages_per_seq = 0;
    c.spec.max_num_batched_tokens = 0;
    c.options.num_kv_pages_per_block.reset();
    c.options.num_queries_per_block.reset();
    for (int threads = 1; threads <= 4; ++threads) {
      c.threads = threads;
      const SyntheticBatch b = testing::MakeSyntheticBatch(c.spec);
      const Outputs first = RunCase(c, b, true);
      for (int repeat = 0; repeat < 2; ++repeat) {
        EXPECT_EQ(RunCase(c, b, true).out, first.out) << c.Name();
      }
    }
  }
}

// ---- The plan.
TEST(PlanTest, TasksCoverEveryVisibleKeyOnce) {
  std::vector<int32_t> kv_lens = {5000, 1, 700};
  std::vector<int32_t> cu = {0, 1, 2, 102};
  std::vector<int32_t> pages(3 * 400, 0);
  AttentionProblem p;
  p.num_tokens = 102;
  p.num_q_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim = 64;
  p.page_size = 16;
  p.pages_per_seq = 400;
  p.kv_lens = kv_lens.data();
  p.cu_q_lens = cu.data();
  p.page_indices = pages.data();
  p.page_indices_row_stride = 400;
  p.num_seqs = 3;
  p.mask_value = -1e30f;
  p.sliding_window = 0;
  for (int threads : {1, 2, 4, 16}) {
    Plan plan;
    BuildPlan(p, threads, plan);
    // keys[seq][q token][kv head] counted over tasks.
    std::vector<int64_t> covered(3 * 100 * 2, 0);
    for (const KernelTask& t : plan.tasks) {
      EXPECT_LE(t.kv_end, kv_lens[t.seq]);
      EXPECT_LE(t.kv_begin, t.kv_end);
      for (int32_t j = t.q_begin; j < t.q_end; ++j) {
        for (int32_t h = t.kv_head; h < t.kv_head_end; ++h) {
          covered[(t.seq * 100 + j) * 2 + h] += t.kv_end - t.kv_begin;
        }
      }
    }
    for (int32_t seq = 0; seq < 3; ++seq) {
      const int32_t q_len = cu[seq + 1] - cu[seq];
      for (int32_t j = 0; j < q_len; ++j) {
        for (int h = 0; h < 2; ++h) {
          // At least the causally visible keys, at most the q tile's.
          const int64_t visible = kv_lens[seq] - q_len + j + 1;
          EXPECT_GE(covered[(seq * 100 + j) * 2 + h], visible);
          EXPECT_LE(covered[(seq * 100 + j) * 2 + h], visible + plan.q_tile);
        }
      }
    }
    // Split only when there are threads to use and too few tasks for them.
    if (threads == 1) {
      EXPECT_TRUE(plan.merges.empty());
    }
    if (threads == 16) {
      EXPECT_FALSE(plan.merges.empty());
    }
    std::vector<bool> seen(plan.tasks.size(), false);
    for (int32_t i : plan.order) seen[i] = true;
    for (bool s : seen) EXPECT_TRUE(s);
  }
}

TEST(PlanTest, AutomaticBlocksClampToPagesPerSeq) {
  AttentionProblem p;
  p.num_tokens = 16;
  p.num_q_heads = 4;
  p.num_kv_heads = 4;
  p.head_dim = 8;
  p.page_size = 1;
  p.pages_per_seq = 3;
  EXPECT_EQ(ChooseTileSizes(p).pages_per_block, 3);
  p.page_size = 1024;
  p.pages_per_seq = 8;
  EXPECT_EQ(ChooseTileSizes(p).pages_per_block, 1);
  p.num_kv_pages_per_block = 5;
  p.num_queries_per_block = 2;
  EXPECT_EQ(ChooseTileSizes(p).pages_per_block, 5);
  EXPECT_EQ(ChooseTileSizes(p).q_tile, 2);
}

// One size from the caller, the other chosen: the chosen one is refitted to
// vmem_limit_bytes around the caller's (the chooser fitted its own pair).
// The bytes the run allocates per worker for the plan of p with 2 threads
// (LayoutScratch over the plan's scratch shape, as ComputeAttention does).
int64_t PlannedScratchBytes(const AttentionProblem& p) {
  Plan plan;
  BuildPlan(p, 2, plan);
  return ScratchBytes(plan.scratch);
}

// The same for the tiles t of p, as the plan would shape its scratch.
int64_t WorkerScratchBytes(const AttentionProblem& p, const TileSizes& t) {
  return ScratchBytes({.q_tile = t.q_tile,
                       .kv_block = t.pages_per_block * p.page_size,
                       .group = p.QueriesPerKvHead(),
                       .num_kv_heads = p.num_kv_heads,
                       .head_dim = p.head_dim,
                       .kv_dtype = p.kv_dtype});
}

// Decode tasks take every kv head (num_kv_heads x the rows of a query tile):
// the scratch the run allocates for them, not just one kv head's, must fit
// vmem_limit_bytes (it did not: the fit budgeted one kv head's rows).
TEST(PlanTest, AllocatedScratchOfMultiHeadDecodeFitsVmem) {
  std::vector<int32_t> kv_lens(16, 4096), cu(17), pages(16 * 256);
  for (int i = 0; i <= 16; ++i) cu[i] = i;
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int32_t>(i % 4096);
  AttentionProblem p;
  p.num_tokens = 16;
  p.page_size = 16;
  p.pages_per_seq = 256;
  p.num_pages = 4096;
  p.max_num_seqs = 16;
  p.kv_dtype = p.q_dtype = DType::kBF16;
  p.kv_lens = kv_lens.data();
  p.cu_q_lens = cu.data();
  p.page_indices = pages.data();
  p.page_indices_row_stride = 256;
  p.num_seqs = 16;
  p.sm_scale = 0.1f;
  p.mask_value = static_cast<float>(kDefaultMaskValue);
  // (q heads, kv heads, head_dim): many kv heads of one row each is where
  // one kv head's rows and the task's differ most.
  for (const auto& [q_heads, kv_heads, dim] :
       {std::tuple{32, 8, 128}, std::tuple{64, 64, 256}, std::tuple{16, 16, 64}}) {
    p.num_q_heads = q_heads;
    p.num_kv_heads = kv_heads;
    p.head_dim = dim;
    // (Below ~300 KiB the 64-head case fits no tile: the chooser then takes
    // the smallest, which this does not check.)
    for (int64_t vmem : {int64_t{512} << 10, int64_t{1} << 20, int64_t{2} << 20}) {
      p.vmem_limit_bytes = vmem;
      EXPECT_LE(PlannedScratchBytes(p), vmem)
          << q_heads << "/" << kv_heads << " heads, head_dim " << dim << ", vmem " << vmem;
    }
  }
}

TEST(PlanTest, ChosenSizeFitsVmemAroundTheCallersOne) {
  AttentionProblem p;
  p.num_tokens = 4096;
  p.num_q_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim = 128;
  p.page_size = 16;
  p.pages_per_seq = 256;
  p.kv_dtype = p.q_dtype = DType::kBF16;
  p.vmem_limit_bytes = 3 << 20;
  p.num_queries_per_block = 256;  // 1024 rows: the chooser's KV tile must shrink.
  TileSizes t = ChooseTileSizes(p);
  EXPECT_EQ(t.q_tile, 256);
  EXPECT_LE(WorkerScratchBytes(p, t), p.vmem_limit_bytes);
  p.num_queries_per_block = 0;
  p.num_kv_pages_per_block = 128;  // 2048 keys: the chooser's query tile must shrink.
  t = ChooseTileSizes(p);
  EXPECT_EQ(t.pages_per_block, 128);
  EXPECT_LE(WorkerScratchBytes(p, t), p.vmem_limit_bytes);
}

// ---- The thread pool.
TEST(ThreadPoolTest, EveryTaskRunsOnce) {
  ThreadPool pool;
  for (int workers = 1; workers <= 5; ++workers) {
    std::vector<std::atomic<int>> runs(1000);
    std::atomic<int> bad_worker{0};
    pool.ParallelFor(1000, workers, [&](int64_t task, int worker) {
      runs[task].fetch_add(1);
      if (worker < 0 || worker >= workers) bad_worker.fetch_add(1);
    });
    for (const auto& r : runs) EXPECT_EQ(r.load(), 1);
    EXPECT_EQ(bad_worker.load(), 0);
  }
}

TEST(ThreadPoolTest, ResolveNumThreads) {
  EXPECT_EQ(ResolveNumThreads(3), 3);
  setenv("RPA_NUM_THREADS", "2", 1);
  EXPECT_EQ(ResolveNumThreads(0), 2);
  setenv("RPA_NUM_THREADS", "junk", 1);
  EXPECT_GE(ResolveNumThreads(0), 1);
  unsetenv("RPA_NUM_THREADS");
}

// The passes of a task over every kv head, taken in the order the walk runs
// them (head 0's K, its V, head 1's K, ...), prefetch each row of the next
// tile once, in ascending address order within each page: a sequential
// stream (NextTileRows), here for a combined cache of 4 kv heads whose
// 5-token tile spans two pages in reverse order.
TEST(NextTileRowsTest, PassesDealEveryRowOnceInAddressOrder) {
  constexpr int64_t kHeads = 4, kRowBytes = 64, kTokens = 5, kPageSize = 4;
  constexpr int64_t kTokenBytes = 2 * kHeads * kRowBytes;  // K, V of each head.
  std::vector<uint8_t> cache(2 * kPageSize * kTokenBytes);
  // Tokens 0-3 in page 1, token 4 in page 0.
  const uint8_t* k_base[kTokens];
  const uint8_t* v_base[kTokens];
  for (int64_t i = 0; i < kTokens; ++i) {
    const int64_t page = i < kPageSize ? 1 : 0;
    k_base[i] = cache.data() + (page * kPageSize + i % kPageSize) * kTokenBytes;
    v_base[i] = k_base[i] + kRowBytes;
  }
  PagesView k{cache.data(), kPageSize * 2 * kHeads * kRowBytes, 2 * kHeads * kRowBytes, 2 * kRowBytes};
  PagesView v = k;
  ASSERT_TRUE(TokenRowsTogether(k, v));
  std::vector<const uint8_t*> list(2 * kHeads * kTokens);
  ListRowsInAddressOrder(k_base, v_base, kTokens, kHeads, 2 * kRowBytes, 2 * kRowBytes, list.data());
  NextTileRows next{list.data(), kTokens, /*address_order=*/true};
  std::vector<const uint8_t*> dealt;
  for (int64_t h = 0; h < kHeads; ++h) {
    for (int kv = 0; kv < 2; ++kv) {
      const KvRows rows = next.ForPass(k_base, h * 2 * kRowBytes, h, kv);
      EXPECT_EQ(rows.prefetch_to, PrefetchTo::kL1);
      for (int64_t i = 0; i < rows.count; ++i) dealt.push_back(static_cast<const uint8_t*>(rows[i]));
    }
  }
  // Every row of the tile once...
  std::vector<const uint8_t*> expected;
  for (int64_t i = 0; i < kTokens; ++i) {
    for (int64_t r = 0; r < 2 * kHeads; ++r) expected.push_back(k_base[i] + r * kRowBytes);
  }
  std::vector<const uint8_t*> sorted_dealt = dealt, sorted_expected = expected;
  std::sort(sorted_dealt.begin(), sorted_dealt.end());
  std::sort(sorted_expected.begin(), sorted_expected.end());
  EXPECT_EQ(sorted_dealt, sorted_expected);
  // ...token by token, each token's rows in address order.
  EXPECT_EQ(dealt, expected);

  // Heads outermost in a page (HND): each pass keeps its own head's rows, into L2.
  PagesView hnd{cache.data(), kPageSize * kHeads * kRowBytes, kRowBytes, kPageSize * kRowBytes};
  EXPECT_FALSE(TokenRowsTogether(hnd, hnd));
  const NextTileRows own{list.data(), kTokens, /*address_order=*/false};
  const KvRows rows = own.ForPass(k_base, 3 * 2 * kRowBytes, 3, 0);
  EXPECT_EQ(rows.prefetch_to, PrefetchTo::kL2);
  ASSERT_EQ(rows.count, kTokens);
  for (int64_t i = 0; i < kTokens; ++i) EXPECT_EQ(rows[i], k_base[i] + 3 * 2 * kRowBytes);
}

}  // namespace
}  // namespace rpa::internal
