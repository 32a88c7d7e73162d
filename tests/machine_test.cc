// The machine limits that rpa bench and rpa demo divide by (testing/machine.h):
// how two measurements combine and how a roofline is formed from them. The
// measurement itself is timing and is not tested here.
#include "testing/machine.h"

#include <gtest/gtest.h>

namespace rpa::testing {
namespace {

MachineLimits Limits(double read1, double read_all, double fma1, double fma_all, double bf16_1,
                     double bf16_all) {
  MachineLimits m;
  m.threads = 2;
  m.read_gbs[0] = read1;
  m.read_gbs[1] = read_all;
  m.fma_f32_gflops[0] = fma1;
  m.fma_f32_gflops[1] = fma_all;
  m.bf16_dot_gflops[0] = bf16_1;
  m.bf16_dot_gflops[1] = bf16_all;
  m.seconds = 2.0;
  return m;
}

TEST(MachineLimitsTest, HigherLimitsTakesEachFiguresMaximumSeparately) {
  // A neighbour took the second core during the first measurement and the
  // memory bus during the second: each figure keeps its better reading.
  const MachineLimits a = Limits(14.0, 14.5, 170.0, 171.0, 85.0, 86.0);
  const MachineLimits b = Limits(12.0, 27.5, 160.0, 340.0, 84.0, 168.0);
  const MachineLimits m = HigherLimits(a, b);
  EXPECT_EQ(m.read_gbs[0], 14.0);
  EXPECT_EQ(m.read_gbs[1], 27.5);
  EXPECT_EQ(m.fma_f32_gflops[0], 170.0);
  EXPECT_EQ(m.fma_f32_gflops[1], 340.0);
  EXPECT_EQ(m.bf16_dot_gflops[0], 85.0);
  EXPECT_EQ(m.bf16_dot_gflops[1], 168.0);
  EXPECT_EQ(m.seconds, 4.0);
  EXPECT_EQ(m.threads, 2);
  // Symmetric.
  const MachineLimits n = HigherLimits(b, a);
  EXPECT_EQ(n.read_gbs[1], 27.5);
  EXPECT_EQ(n.fma_f32_gflops[0], 170.0);
}

TEST(MachineLimitsTest, RooflineIsTheSlowerOfMemoryAndTheFastestArithmetic) {
  const MachineLimits m = Limits(10.0, 20.0, 100.0, 200.0, 50.0, 400.0);
  // 1e9 bytes at 10 GB/s = 0.1 s; 1e9 FLOPs at 100 GFLOP/s = 0.01 s.
  EXPECT_DOUBLE_EQ(m.RooflineSeconds(1e9, 1e9, DType::kBF16, false), 0.1);
  // Compute-bound: 1e11 FLOPs; on one thread the FMA peak (100) beats the
  // bf16 dot (50), on all threads the bf16 dot (400) beats the FMA (200).
  EXPECT_DOUBLE_EQ(m.RooflineSeconds(1e11, 1e9, DType::kBF16, false), 1.0);
  EXPECT_DOUBLE_EQ(m.RooflineSeconds(1e11, 1e9, DType::kBF16, true), 0.25);
  // f32 K/V cannot use the bf16 dot: the FMA peak.
  EXPECT_DOUBLE_EQ(m.RooflineSeconds(1e11, 1e9, DType::kF32, true), 0.5);
}

TEST(MachineLimitsTest, TheF16PeakCountsForDtypesExactInF16) {
  MachineLimits m = Limits(10.0, 20.0, 100.0, 200.0, 50.0, 100.0);
  m.fma_f16_gflops[0] = 200.0;
  m.fma_f16_gflops[1] = 1000.0;
  // 8-bit floats are exact in f16: its peak, where it is the highest.
  EXPECT_DOUBLE_EQ(m.PeakGflops(DType::kF8E4M3FN, true), 1000.0);
  EXPECT_DOUBLE_EQ(m.PeakGflops(DType::kF8E5M2, false), 200.0);
  EXPECT_DOUBLE_EQ(m.PeakGflops(DType::kF16, true), 1000.0);
  // bf16 is not (its range is wider), nor f32: the best of the rest.
  EXPECT_DOUBLE_EQ(m.PeakGflops(DType::kBF16, true), 200.0);
  EXPECT_DOUBLE_EQ(m.PeakGflops(DType::kF32, false), 100.0);
  // HigherLimits starts from its first argument: the higher f16 figures come
  // from the second one here, so only taking the maximum passes.
  const MachineLimits higher = HigherLimits(Limits(10.0, 20.0, 100.0, 200.0, 50.0, 100.0), m);
  EXPECT_EQ(higher.fma_f16_gflops[0], 200.0);
  EXPECT_EQ(higher.fma_f16_gflops[1], 1000.0);
}

TEST(MachineLimitsTest, TheAmxPeakCountsForDtypesExactInBf16) {
  MachineLimits m = Limits(10.0, 20.0, 100.0, 200.0, 50.0, 400.0);
  m.fma_f16_gflops[0] = 150.0;
  m.fma_f16_gflops[1] = 300.0;
  m.amx_bf16_gflops[0] = 900.0;
  m.amx_bf16_gflops[1] = 1800.0;
  // bf16, the 8-bit floats and int8 are exact in bf16: AMX's peak.
  EXPECT_DOUBLE_EQ(m.PeakGflops(DType::kBF16, true), 1800.0);
  EXPECT_DOUBLE_EQ(m.PeakGflops(DType::kBF16, false), 900.0);
  EXPECT_DOUBLE_EQ(m.PeakGflops(DType::kF8E4M3FN, true), 1800.0);
  EXPECT_DOUBLE_EQ(m.PeakGflops(DType::kF8E5M2, false), 900.0);
  EXPECT_DOUBLE_EQ(m.PeakGflops(DType::kI8, true), 1800.0);
  // f16 and f32 are not: the f16 FMA and the f32 FMA peaks.
  EXPECT_DOUBLE_EQ(m.PeakGflops(DType::kF16, true), 300.0);
  EXPECT_DOUBLE_EQ(m.PeakGflops(DType::kF32, true), 200.0);
  // 1e12 FLOPs of bf16 K/V at 1800 GFLOP/s beat 1e9 bytes at 20 GB/s.
  EXPECT_DOUBLE_EQ(m.RooflineSeconds(1e12, 1e9, DType::kBF16, true), 1e12 / 1800e9);
}

TEST(MachineLimitsTest, HigherLimitsTakesTheAmxMaximumPerThreadCount) {
  MachineLimits a = Limits(10.0, 20.0, 100.0, 200.0, 50.0, 100.0);
  MachineLimits b = a;
  a.amx_bf16_gflops[0] = 900.0;  // One thread: a is higher.
  a.amx_bf16_gflops[1] = 1000.0;
  b.amx_bf16_gflops[0] = 800.0;  // All threads: b is higher.
  b.amx_bf16_gflops[1] = 1700.0;
  for (const MachineLimits& m : {HigherLimits(a, b), HigherLimits(b, a)}) {
    EXPECT_EQ(m.amx_bf16_gflops[0], 900.0);
    EXPECT_EQ(m.amx_bf16_gflops[1], 1700.0);
  }
}

}  // namespace
}  // namespace rpa::testing
