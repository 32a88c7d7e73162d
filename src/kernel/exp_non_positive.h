// e^x for x <= 0, the one exp every softmax of the kernels computes (x =
// logit - running maximum), in two implementations that share these
// constants: Highway's (exp_non_positive-inl.h, every target: the unfused
// softmax and MLA's) and AVX-512's (avx512_common.h: the fused tiles, and
// the Highway one on AVX-512 targets).
//
// Method: n = round(x log2 e); r = x - n ln2 in two steps (kLn2Hi has
// trailing zeros, so n * kLn2Hi is exact), |r| <= ln2 / 2; e^r by its Taylor
// polynomial to degree 7 (truncation below 1e-8); times 2^n. Within about
// 2 ulp of e^x (Highway's Exp, measured: 1.9e-7 relative at most).
// Below kLowest (e^-87, just above the smallest normal float) the result is
// 0: such a weight cannot move a sum that holds e^0 = 1, and no denormal
// reaches the products; -inf gives 0.
//
// The polynomial is evaluated in Estrin's form, (t0 + t1 r) + r^2 (t2 + t3 r)
// + r^4 ((t4 + t5 r) + r^2 (t6 + t7 r)): three multiply-adds deep instead of
// Horner's seven. The softmax loops are bound by that chain's latency, not by
// issue (docs/kernel_log.md, twelfth session: 4.3 -> 3.0 ns per 16 weights).
#ifndef RPA_SRC_KERNEL_EXP_NON_POSITIVE_H_
#define RPA_SRC_KERNEL_EXP_NON_POSITIVE_H_

namespace rpa::internal::exp_non_positive {

inline constexpr float kLowest = -87.0f;
inline constexpr float kLog2E = 1.44269504f;
inline constexpr float kLn2Hi = 0.693145751953125f;
inline constexpr float kLn2Lo = 1.428606765330187e-6f;
// 1 / k! for k = 0..7.
inline constexpr float kTaylor[8] = {1.0f,        1.0f,         1.0f / 2,   1.0f / 6,
                                     1.0f / 24,   1.0f / 120,   1.0f / 720, 1.0f / 5040};

}  // namespace rpa::internal::exp_non_positive

#endif  // RPA_SRC_KERNEL_EXP_NON_POSITIVE_H_
