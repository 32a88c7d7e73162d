#include "testing/machine.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernel/amx.h"
#include "kernel/cpu_features.h"
#include "testing/amx_experimental.h"
#include "threads/thread_pool.h"

#if defined(__x86_64__)
// GCC 12's _mm*_undefined_* trip -Wuninitialized where they inline.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace rpa::testing {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Best(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

volatile uint64_t g_sink = 0;

// The compute probes are x86-64 code; elsewhere only the bandwidth is measured.
#if defined(__x86_64__)
bool HasAvx2Fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
bool HasAvx512() { return __builtin_cpu_supports("avx512f"); }

__attribute__((target("avx2"))) uint64_t ReadSliceAvx2(const uint8_t* p, size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 128 <= bytes; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

uint64_t ReadSlice(const uint8_t* p, size_t bytes) {
#if defined(__x86_64__)
  if (HasAvx2Fma()) return ReadSliceAvx2(p, bytes);
#endif
  const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i + 4 <= bytes / 8; i += 4) {
    a += w[i];
    b += w[i + 1];
    c += w[i + 2];
    d += w[i + 3];
  }
  return a + b + c + d;
}

// Streaming read GB/s over `buffer` split among `threads` workers.
double ReadBandwidth(const HugeBuffer& buffer, int threads, int reps) {
  internal::ThreadPool& pool = internal::GlobalThreadPool();
  const size_t slice = buffer.size / static_cast<size_t>(threads) / 4096 * 4096;
  std::vector<double> gbs;
  std::vector<uint64_t> sums(static_cast<size_t>(threads));
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    pool.ParallelFor(threads, threads, [&](int64_t task, int) {
      sums[task] = ReadSlice(buffer.data + slice * task, slice);
    });
    const double s = Seconds(t0, Clock::now());
    for (uint64_t x : sums) g_sink = g_sink + x;
    gbs.push_back(static_cast<double>(slice) * threads / s * 1e-9);
  }
  return Best(gbs);
}

// The compute probes: kAcc independent accumulators, each updated once per
// iteration, so the loop is bound by the instruction's throughput, not its
// latency, as long as kAcc >= latency x instructions per cycle (FMA: 4 x 2;
// vdpbf16ps: ~6 x 2). Each returns the FLOPs it did: an FMA lane is 2, a
// vdpbf16ps lane 4 (two bf16 products and their two additions).
#if defined(__x86_64__)
constexpr int kAcc = 16;

__attribute__((target("avx2,fma"))) double FmaAvx2(int64_t iters) {
  __m256 a[kAcc];
  for (int i = 0; i < kAcc; ++i) a[i] = _mm256_set1_ps(0.001f * i);
  const __m256 b = _mm256_set1_ps(0.99999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kAcc; ++i) a[i] = _mm256_fmadd_ps(a[i], b, c);
  }
  __m256 s = a[0];
  for (int i = 1; i < kAcc; ++i) s = _mm256_add_ps(s, a[i]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  g_sink = g_sink + static_cast<uint64_t>(out[0]);
  return static_cast<double>(iters) * kAcc * 8 * 2;
}

__attribute__((target("avx512f"))) double FmaAvx512(int64_t iters) {
  __m512 a[kAcc];
  for (int i = 0; i < kAcc; ++i) a[i] = _mm512_set1_ps(0.001f * i);
  const __m512 b = _mm512_set1_ps(0.99999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kAcc; ++i) a[i] = _mm512_fmadd_ps(a[i], b, c);
  }
  __m512 s = a[0];
  for (int i = 1; i < kAcc; ++i) s = _mm512_add_ps(s, a[i]);
  g_sink = g_sink + static_cast<uint64_t>(_mm512_reduce_add_ps(s));
  return static_cast<double>(iters) * kAcc * 16 * 2;
}

__attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl"))) double DotBf16(int64_t iters) {
  __m512 a[kAcc];
  for (int i = 0; i < kAcc; ++i) a[i] = _mm512_set1_ps(0.001f * i);
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3F80));  // 1.0
  const __m512bh c = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3380));  // ~6e-8
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kAcc; ++i) a[i] = _mm512_dpbf16_ps(a[i], b, c);
  }
  __m512 s = a[0];
  for (int i = 1; i < kAcc; ++i) s = _mm512_add_ps(s, a[i]);
  g_sink = g_sink + static_cast<uint64_t>(_mm512_reduce_add_ps(s));
  return static_cast<double>(iters) * kAcc * 16 * 4;
}

// vfmadd231ph on 32 halves, by inline assembly as in the kernel (Clang 14
// declares the f16 intrinsics only for files compiled for AVX512-FP16).
__attribute__((target("avx512f"))) double FmaF16(int64_t iters) {
  __m512 a[kAcc];
  for (int i = 0; i < kAcc; ++i) a[i] = _mm512_castsi512_ps(_mm512_set1_epi16(0));
  const __m512 b = _mm512_castsi512_ps(_mm512_set1_epi16(0x3C00));  // 1.0
  const __m512 c = _mm512_castsi512_ps(_mm512_set1_epi16(0x1400));  // 2^-10
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kAcc; ++i) __asm__("vfmadd231ph %2, %1, %0" : "+v"(a[i]) : "v"(b), "v"(c));
  }
  __m512i s = _mm512_castps_si512(a[0]);
  for (int i = 1; i < kAcc; ++i) s = _mm512_xor_si512(s, _mm512_castps_si512(a[i]));
  g_sink = g_sink + static_cast<uint64_t>(_mm512_reduce_add_epi32(s));
  return static_cast<double>(iters) * kAcc * 32 * 2;
}

// GFLOP/s of `kernel` run on `threads` threads at once; best of reps. Each
// worker times its own loop (the pool's wake-up is not the probe's).
double PeakGflops(double (*kernel)(int64_t), int threads, int reps, int64_t iters) {
  internal::ThreadPool& pool = internal::GlobalThreadPool();
  std::vector<double> results;
  std::vector<double> rate(static_cast<size_t>(threads));
  for (int r = 0; r < reps; ++r) {
    pool.ParallelFor(threads, threads, [&](int64_t task, int) {
      const auto t0 = Clock::now();
      const double flops = kernel(iters);
      rate[task] = flops / Seconds(t0, Clock::now()) * 1e-9;
    });
    double total = 0.0;
    for (double x : rate) total += x;
    results.push_back(total);
  }
  return Best(results);
}

// The AMX bf16 peak (tdpbf16ps on full tiles, amx_experimental.h's probe) on
// `threads` threads at once, best of reps; each probe releases its tiles.
double AmxPeakGflops(int threads, int reps, double seconds) {
  internal::ThreadPool& pool = internal::GlobalThreadPool();
  std::vector<double> results;
  std::vector<double> rate(static_cast<size_t>(threads));
  for (int r = 0; r < reps; ++r) {
    pool.ParallelFor(threads, threads, [&](int64_t task, int) {
      rate[task] = AmxBf16PeakGflops(seconds);
      internal::AmxReleaseTiles();
    });
    double total = 0.0;
    for (double x : rate) total += x;
    results.push_back(total);
  }
  return Best(results);
}

// Index i (0: one thread, 1: all) of every compute peak this CPU has.
void MeasureComputePeaks(MachineLimits& limits, int i, int threads, int reps, bool quick) {
  // ~20 ms (quick) / ~60 ms per probe repetition at ~100 GFLOP/s.
  const int64_t iters = quick ? 1000000 : 3000000;
  if (HasAvx2Fma()) limits.fma_f32_gflops[i] = PeakGflops(FmaAvx2, threads, reps, iters);
  if (HasAvx512()) {
    limits.fma_f32_gflops[i] =
        std::max(limits.fma_f32_gflops[i], PeakGflops(FmaAvx512, threads, reps, iters));
  }
  if (limits.avx512_bf16) limits.bf16_dot_gflops[i] = PeakGflops(DotBf16, threads, reps, iters);
  if (limits.avx512_fp16) limits.fma_f16_gflops[i] = PeakGflops(FmaF16, threads, reps, iters);
  if (internal::DetectedCpuFeatures().amx_bf16) {
    limits.amx_bf16_gflops[i] = AmxPeakGflops(threads, reps, quick ? 0.02 : 0.06);
  }
}
#endif

}  // namespace

HugeBuffer::HugeBuffer(size_t bytes) : size(bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  madvise(p, bytes, MADV_HUGEPAGE);
  data = static_cast<uint8_t*>(p);
}

HugeBuffer::~HugeBuffer() {
  if (data != nullptr) munmap(data, size);
}

int64_t LastLevelCacheBytes() {
  long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return llc > 0 ? llc : (32 << 20);
}

double MachineLimits::PeakGflops(DType kv_dtype, bool all_threads) const {
  const int i = all_threads ? 1 : 0;
  // Every K/V dtype can be widened to f32 exactly and multiplied with FMA;
  // bf16 and the 8-bit floats are also exact in bf16, so the bf16 dot
  // counts for them where it is faster (on the CPU measured here it is not:
  // vdpbf16ps issues every other cycle, half the f32 FMA rate).
  const bool fp8 = kv_dtype == DType::kF8E4M3FN || kv_dtype == DType::kF8E5M2;
  double peak = fma_f32_gflops[i];
  if (kv_dtype == DType::kBF16 || fp8) peak = std::max(peak, bf16_dot_gflops[i]);
  // f16 and the 8-bit floats are exact in f16 (bf16 is not: its range is
  // wider); the kernel's fp8 decode tiles multiply in f16.
  if (kv_dtype == DType::kF16 || fp8) peak = std::max(peak, fma_f16_gflops[i]);
  // AMX takes bf16: bf16, the 8-bit floats and int8 are exact in it.
  if (kv_dtype == DType::kBF16 || fp8 || kv_dtype == DType::kI8) {
    peak = std::max(peak, amx_bf16_gflops[i]);
  }
  return peak;
}

double MachineLimits::RooflineSeconds(double flops, double bytes, DType kv_dtype,
                                      bool all_threads) const {
  const double bw = read_gbs[all_threads ? 1 : 0] * 1e9;
  const double peak = PeakGflops(kv_dtype, all_threads) * 1e9;
  return std::max(bw > 0 ? bytes / bw : 0.0, peak > 0 ? flops / peak : 0.0);
}

MachineLimits MeasureMachine(int threads, bool quick) {
  const auto start = Clock::now();
  MachineLimits limits;
  limits.threads = internal::ResolveNumThreads(threads);
  limits.llc_bytes = LastLevelCacheBytes();
  limits.avx512_bf16 = internal::DetectedCpuFeatures().avx512bf16;
  limits.avx512_fp16 = internal::DetectedCpuFeatures().avx512fp16;
  limits.amx = internal::AmxDetection();
  // At least 4x the LLC, so the reads come from memory.
  const size_t bytes = std::clamp<size_t>(static_cast<size_t>(limits.llc_bytes) * 4,
                                          size_t{1} << 30, size_t{4} << 30);
  HugeBuffer buffer(quick ? std::max<size_t>(size_t{1} << 30,
                                             static_cast<size_t>(limits.llc_bytes) * 4)
                          : bytes);
  std::memset(buffer.data, 1, buffer.size);
  const int reps = quick ? 3 : 7;
  const int counts[2] = {1, limits.threads};
  for (int i = 0; i < 2; ++i) {
    limits.read_gbs[i] = ReadBandwidth(buffer, counts[i], reps);
#if defined(__x86_64__)
    MeasureComputePeaks(limits, i, counts[i], reps, quick);
#endif
  }
  limits.seconds = Seconds(start, Clock::now());
  return limits;
}

MachineLimits HigherLimits(const MachineLimits& a, const MachineLimits& b) {
  MachineLimits m = a;
  for (int i = 0; i < 2; ++i) {
    m.read_gbs[i] = std::max(a.read_gbs[i], b.read_gbs[i]);
    m.fma_f32_gflops[i] = std::max(a.fma_f32_gflops[i], b.fma_f32_gflops[i]);
    m.bf16_dot_gflops[i] = std::max(a.bf16_dot_gflops[i], b.bf16_dot_gflops[i]);
    m.fma_f16_gflops[i] = std::max(a.fma_f16_gflops[i], b.fma_f16_gflops[i]);
    m.amx_bf16_gflops[i] = std::max(a.amx_bf16_gflops[i], b.amx_bf16_gflops[i]);
  }
  m.seconds = a.seconds + b.seconds;
  return m;
}

}  // namespace rpa::testing
