// This machine's limits, measured (docs/contract.md §5): streaming read bandwidth over a
// buffer several times the last-level cache, the f32 FMA peak, and the bf16
// dot peak (vdpbf16ps), the f16 FMA peak (vfmadd231ph) and the AMX bf16 peak
// (tdpbf16ps) where the CPU has them, each on one thread and on
// `threads` threads at once. `rpa bench` reports its workloads as fractions
// of these; `rpa demo` can print its speed against them.
#ifndef RPA_TESTING_MACHINE_H_
#define RPA_TESTING_MACHINE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "rpa/dtype.h"

namespace rpa::testing {

struct MachineLimits {
  int threads = 1;          // The "all threads" count measured.
  int64_t llc_bytes = 0;    // Last-level cache (sysconf; 32 MiB if unknown).
  bool avx512_bf16 = false;  // vdpbf16ps available (CPUID + OS state).
  bool avx512_fp16 = false;  // AVX512-FP16 arithmetic available.
  std::string amx;           // AMX's status: "usable", or which step of its detection failed.
  // [0]: one thread, [1]: `threads` threads together.
  double read_gbs[2] = {0, 0};         // GB/s (1e9 B/s), streaming reads.
  double fma_f32_gflops[2] = {0, 0};   // Best of the AVX2 and AVX-512 FMA loops.
  double bf16_dot_gflops[2] = {0, 0};  // 0: no bf16 dot on this CPU.
  double fma_f16_gflops[2] = {0, 0};   // 0: no AVX512-FP16 on this CPU.
  double amx_bf16_gflops[2] = {0, 0};  // 0: no usable AMX (tdpbf16ps) on this CPU.
  double seconds = 0;                  // How long the measurement took.

  // Peak GFLOP/s of the fastest arithmetic this CPU offers for attention on
  // K/V of `kv_dtype`: the f32 FMA peak, or where higher the bf16 dot peak
  // for bf16 and 8-bit float K/V and the f16 FMA peak for f16 and 8-bit
  // float K/V (exact in f16; the kernel's fp8 decode tiles use it).
  // all_threads picks index 1.
  double PeakGflops(DType kv_dtype, bool all_threads) const;
  // The roofline time in seconds of `flops` FLOPs reading `bytes` bytes.
  double RooflineSeconds(double flops, double bytes, DType kv_dtype, bool all_threads) const;
};

// Measures the limits on 1 and `threads` threads (0: RPA_NUM_THREADS or all
// cores). quick: ~3-5 s (a 1 GiB buffer, short probes); else ~10-20 s.
// Each figure is the best of several repetitions: a peak is what the
// hardware can do, and on a shared machine other work only ever slows a
// repetition down.
MachineLimits MeasureMachine(int threads, bool quick);

// Each limit the higher of a's and b's (interference only lowers a
// measurement); seconds: both measurements' together.
MachineLimits HigherLimits(const MachineLimits& a, const MachineLimits& b);

// Anonymous memory that asks for transparent huge pages (MADV_HUGEPAGE):
// the operating system here grants them only to memory that asks.
struct HugeBuffer {
  uint8_t* data = nullptr;
  size_t size = 0;
  explicit HugeBuffer(size_t bytes);
  ~HugeBuffer();
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;
};

int64_t LastLevelCacheBytes();

}  // namespace rpa::testing

#endif  // RPA_TESTING_MACHINE_H_
