// How many of one AVX-512 instruction a core retires per nanosecond, for
// the instructions the bf16-pair and widening tiles are made of: the
// products (vdpbf16ps, vfmadd), the reduction tree's shuffles and adds, the
// PV pass's unpacks, the softmax's blends and maxima. `BM_Throughput/<op>`
// reports ns per instruction over 16 independent chains (more than any of
// them needs to cover its latency: vdpbf16ps's ~6 cycles at 2 a cycle takes
// 12), so ratios between rows say which port a tile's mix saturates first.
// Without cycle counters on these VMs, divide by the vdpbf16ps row to read
// cycles: 2 a cycle on Zen 5 (0.14 ns at ~3.6 GHz), 1 on Zen 4, whose
// 512-bit operations are double-pumped.
#if defined(__x86_64__)
// First: it includes immintrin.h with GCC 12's false -Wuninitialized in its
// intrinsics silenced (avx512_common.h says why).
#include "kernel/avx512_common.h"
#endif

#include <benchmark/benchmark.h>

#include <cstdint>

#include "kernel/cpu_features.h"

namespace rpa {
namespace {

#if defined(__x86_64__)
enum class Op : int {
  kDpbf16ps,
  kFmaddPs,
  kAddPs,
  kMaxPs,
  kUnpackLoPs,    // vunpcklps: the reduction tree's first level.
  kUnpackLoPd,    // vunpcklpd: its second.
  kShufF32x4,     // vshuff32x4: its last two (128-bit lanes).
  kPermilPs,      // vpermilps: in-lane swaps.
  kPermPs,        // vpermps: any lane to any lane.
  kBlendPs,       // vblendmps under a mask.
  kUnpackLoWd,    // vpunpcklwd: V rows into key pairs.
};

constexpr int kChains = 16;

// kChains chains of `op`, `steps` deep; returns a sum so nothing is dropped.
// Not inlined, and called with a seed the compiler cannot know (the
// benchmark's DoNotOptimize), so no call is hoisted out of the timing loop.
template <Op kOp>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"), noinline)) float Chains(
    int64_t steps, float seed) {
  __m512 a[kChains];
  for (int i = 0; i < kChains; ++i) a[i] = _mm512_set1_ps(seed + static_cast<float>(i));
  const __m512 k = _mm512_set1_ps(1.0f);
  const __m512i ki = _mm512_set1_epi32(0x3F803F80);  // A pair of bf16 1.0.
  for (int64_t s = 0; s < steps; ++s) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) {
      if constexpr (kOp == Op::kDpbf16ps) {
        a[i] = _mm512_dpbf16_ps(a[i], reinterpret_cast<__m512bh>(ki),
                                reinterpret_cast<__m512bh>(ki));
      } else if constexpr (kOp == Op::kFmaddPs) {
        a[i] = _mm512_fmadd_ps(a[i], k, k);
      } else if constexpr (kOp == Op::kAddPs) {
        a[i] = _mm512_add_ps(a[i], k);
      } else if constexpr (kOp == Op::kMaxPs) {
        a[i] = _mm512_max_ps(a[i], k);
      } else if constexpr (kOp == Op::kUnpackLoPs) {
        a[i] = _mm512_unpacklo_ps(a[i], k);
      } else if constexpr (kOp == Op::kUnpackLoPd) {
        a[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a[i]), _mm512_castps_pd(k)));
      } else if constexpr (kOp == Op::kShufF32x4) {
        a[i] = _mm512_shuffle_f32x4(a[i], k, 0x4E);
      } else if constexpr (kOp == Op::kPermilPs) {
        a[i] = _mm512_permute_ps(a[i], 0xB1);
      } else if constexpr (kOp == Op::kPermPs) {
        a[i] = _mm512_permutexvar_ps(ki, a[i]);
      } else if constexpr (kOp == Op::kBlendPs) {
        a[i] = _mm512_mask_blend_ps(0xAAAA, a[i], k);
      } else {
        a[i] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_castps_si512(a[i]), ki));
      }
    }
  }
  __m512 sum = a[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, a[i]);
  return _mm512_reduce_add_ps(sum);
}

template <Op kOp>
void BM_Throughput(benchmark::State& state) {
  const internal::CpuFeatures& cpu = internal::DetectedCpuFeatures();
  if (!cpu.avx512bw || !cpu.avx512bf16) {
    state.SkipWithError("CPU lacks AVX-512 BF16");
    return;
  }
  constexpr int64_t kSteps = 4096;
  float seed = 0.5f;
  for (auto _ : state) {
    benchmark::DoNotOptimize(seed);
    benchmark::DoNotOptimize(Chains<kOp>(kSteps, seed));
  }
  state.counters["ns_per_op"] = benchmark::Counter(
      static_cast<double>(kSteps * kChains) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_Throughput<Op::kDpbf16ps>)->Name("BM_Throughput/vdpbf16ps");
BENCHMARK(BM_Throughput<Op::kFmaddPs>)->Name("BM_Throughput/vfmadd231ps");
BENCHMARK(BM_Throughput<Op::kAddPs>)->Name("BM_Throughput/vaddps");
BENCHMARK(BM_Throughput<Op::kMaxPs>)->Name("BM_Throughput/vmaxps");
BENCHMARK(BM_Throughput<Op::kUnpackLoPs>)->Name("BM_Throughput/vunpcklps");
BENCHMARK(BM_Throughput<Op::kUnpackLoPd>)->Name("BM_Throughput/vunpcklpd");
BENCHMARK(BM_Throughput<Op::kShufF32x4>)->Name("BM_Throughput/vshuff32x4");
BENCHMARK(BM_Throughput<Op::kPermilPs>)->Name("BM_Throughput/vpermilps");
BENCHMARK(BM_Throughput<Op::kPermPs>)->Name("BM_Throughput/vpermps");
BENCHMARK(BM_Throughput<Op::kBlendPs>)->Name("BM_Throughput/vblendmps");
BENCHMARK(BM_Throughput<Op::kUnpackLoWd>)->Name("BM_Throughput/vpunpcklwd");
#endif

}  // namespace
}  // namespace rpa
