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
  const MachineLimits higher = HigherLimits(m, Limits(10.0, 20.0, 100.0, 200.0, 50.0, 100.0));
  EXPECT_EQ(higher.fma_f16_gflops[1], 1000.0);
}

}  // namespace
}  // namespace rpa::testing
