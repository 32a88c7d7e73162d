// e^x for x <= 0 on every Highway target: the one exp of every softmax in
// rpa (exp_non_positive.h has the method and its error): the unfused
// softmax (softmax-inl.h) and MLA's (mla/mla_highway.cc).
// Compiled once per Highway target: include it only through
// hwy/foreach_target.h.
#if defined(RPA_SRC_KERNEL_EXP_NON_POSITIVE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RPA_SRC_KERNEL_EXP_NON_POSITIVE_INL_H_
#undef RPA_SRC_KERNEL_EXP_NON_POSITIVE_INL_H_
#else
#define RPA_SRC_KERNEL_EXP_NON_POSITIVE_INL_H_
#endif

#include "hwy/highway.h"
#include "kernel/avx512_common.h"  // x86-64 only: its AVX-512 exp.
#include "kernel/exp_non_positive.h"
#include "kernel/highway_load-inl.h"  // DF, VF

HWY_BEFORE_NAMESPACE();
namespace rpa::internal {
namespace HWY_NAMESPACE {

// e^x for x <= 0, -inf included (exp_non_positive.h: the method, its error
// and why Estrin's form). On AVX-512 the fused decode tiles' (avx512_common.h),
// where one zero-masked vscalefps does 2^n, the product and the zeroing, and
// makes the clamp needless (docs/kernel_log.md, 2026-12-06 second AMX
// session).
HWY_INLINE VF ExpNonPositive(DF df, VF x) {
#if HWY_TARGET <= HWY_AVX3
  (void)df;
  return VF{avx512::ExpNonPositive(x.raw)};
#else
  namespace e = exp_non_positive;
  const hn::RebindToSigned<DF> di;
  const VF lowest = hn::Set(df, e::kLowest);
  const auto normal = hn::Ge(x, lowest);
  x = hn::Max(x, lowest);  // -inf would make the reduced argument NaN.
  const VF n = hn::Round(hn::Mul(x, hn::Set(df, e::kLog2E)));
  VF r = hn::NegMulAdd(n, hn::Set(df, e::kLn2Hi), x);
  r = hn::NegMulAdd(n, hn::Set(df, e::kLn2Lo), r);
  const auto pair = [&](int k) {  // t_k + t_{k+1} r
    return hn::MulAdd(r, hn::Set(df, e::kTaylor[k + 1]), hn::Set(df, e::kTaylor[k]));
  };
  const VF r2 = hn::Mul(r, r);
  const VF low = hn::MulAdd(r2, pair(2), pair(0));
  const VF high = hn::MulAdd(r2, pair(6), pair(4));
  const VF poly = hn::MulAdd(hn::Mul(r2, r2), high, low);
  // 2^n from its exponent bits, n + 127 (-126 <= n <= 0 here: a normal
  // float). Added to 1.5 * 2^23, the integer n + 127 lands exactly in the
  // mantissa's low bits, which the shift moves to the exponent and the rest
  // out: no float-to-int conversion (Highway's ConvertTo adds a four-
  // instruction overflow fix-up on x86).
  const VF biased = hn::Add(n, hn::Set(df, 12582912.0f + 127.0f));
  const auto two_to_n = hn::BitCast(df, hn::ShiftLeft<23>(hn::BitCast(di, biased)));
  return hn::IfThenElseZero(normal, hn::Mul(poly, two_to_n));
#endif
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace rpa::internal
HWY_AFTER_NAMESPACE();

#endif  // RPA_SRC_KERNEL_EXP_NON_POSITIVE_INL_H_
