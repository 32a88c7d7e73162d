// The online softmax of one row over one KV tile (the unfused step between
// a kernel's logits and its PV): scale, soft cap, mask, the running
// maximum and sum, and the rescale of the row's accumulator. The special
// states it leaves for the end (l = -0, NaN) are read by FinishRow
// (softmax_finish.h).
//
// The fused decode tiles (avx512_common.h) do the same update for 4 rows in
// registers and decline every case that needs the rules below (NaN, an
// infinite maximum, masks): the two cannot be one function without the
// fused tile losing the registers it exists for.
// Compiled once per Highway target: include it only through
// hwy/foreach_target.h (highway_kernel.cc).
#if defined(RPA_SRC_KERNEL_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RPA_SRC_KERNEL_SOFTMAX_INL_H_
#undef RPA_SRC_KERNEL_SOFTMAX_INL_H_
#else
#define RPA_SRC_KERNEL_SOFTMAX_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "hwy/contrib/math/math-inl.h"  // Tanh (the soft cap).
#include "hwy/highway.h"
#include "kernel/exp_non_positive-inl.h"
#include "kernel/highway_load-inl.h"
#include "kernel/softmax_finish.h"

HWY_BEFORE_NAMESPACE();
namespace rpa::internal {
namespace HWY_NAMESPACE {
struct SoftmaxParams {
  float logit_scale;  // sm_scale * k_scale (times kE4M3Rescale where the kernel scales e4m3).
  float soft_cap;     // 0: none.
  float mask_value;
  bool vanish;        // Masked keys get weight exactly 0.
  bool alibi;         // Add RowKeys::alibi_slope * (t - pos) before the cap.
};

// The keys of one row's tile.
struct RowKeys {
  int64_t begin = 0;   // The keys [begin, end) the row sees (AttentionProblem::VisibleKeys);
  int64_t end = 0;     // the others are masked.
  int64_t kv_len = 0;  // Its sequence's keys.
  int64_t t0 = 0;      // The tile's keys [t0, t0 + n) ...
  int64_t n = 0;
  int64_t n_pad = 0;   // ... with weights up to RoundUp(n, Lanes) in s.
  // Keys [0, needed) have logits in s (TileLogits::needed); the rest are
  // masked for the row and skipped (a vanishing mask): weight 0.
  int64_t needed = 0;
  int64_t pos = 0;     // The row's query position (ALiBi's origin).
  float alibi_slope = 0.0f;
  // The custom mask: bit bit0 + i keeps key t0 + i (docs/contract.md §1.6);
  // a clear bit drops the key as if it were beyond n. Null: every key kept.
  const uint8_t* bits = nullptr;
  int64_t bit0 = 0;
};

// The kept lanes of one vector of keys: bits [bit, bit + Lanes) of a packed
// custom mask, read a byte pair at a time (kMaskPadBytes covers the end).
HWY_INLINE hn::Mask<DF> KeptLanes(const uint8_t* bits, int64_t bit) {
  const DF df;
  uint8_t bytes[HWY_MAX_BYTES / sizeof(float) / 8 + 8] = {};
  const int64_t count = (static_cast<int64_t>(hn::Lanes(df)) + 7) / 8;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t b = bit + 8 * k;
    bytes[k] = static_cast<uint8_t>((bits[b / 8] | bits[b / 8 + 1] << 8) >> (b % 8));
  }
  return hn::LoadMaskBits(df, bytes);
}

// Turns one row's logits s [n_pad] into weights in place and updates its
// state (m, l and the accumulator row, row.stride = dim_pad floats).
HWY_INLINE void SoftmaxRow(const SoftmaxParams& sp, const RowKeys& keys, float* s,
                           const SoftmaxState& row) {
  const int64_t begin = keys.begin, end = keys.end, kv_len = keys.kv_len, t0 = keys.t0,
                n = keys.n, needed = keys.needed;
  const int64_t n_pad = keys.n_pad, dim_pad = row.stride;
  float* m = row.m;
  float* l = row.l;
  float* acc = row.acc;
  const DF df;
  const hn::RebindToSigned<DF> di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const VF neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
  const VF scale = hn::Set(df, sp.logit_scale);
  // Keys t outside [begin, end) are masked.
  const bool any_masked = t0 < begin || t0 + needed > end;
  // The logits read: keys [0, needed) in whole vectors; the weights past
  // them up to n_pad are 0.
  const int64_t read_pad = RoundUp(needed, lanes);
  const auto iota = hn::Iota(di, 0);
  VF vmax = neg_inf;
  using MF = hn::Mask<DF>;
  // Lanes of kept keys (custom mask): whether the tile held any.
  MF kept = hn::FirstN(df, 0);
  // Lanes that saw a NaN logit (before the cap: tanh's clamp would hide it).
  MF nan = hn::FirstN(df, 0);
  // Keys [i, i + lanes): s scaled, ALiBi, the custom mask, the cap, the
  // causal/window mask, then stored and taken into the maximum. kWhole:
  // every key below `needed` and none of those options (most tiles of a
  // prefill).
  auto logits = [&]<bool kWhole>(int64_t i) HWY_ATTR {
    VF x = hn::Mul(hn::LoadU(df, s + i), scale);
    if constexpr (kWhole) {
      nan = hn::Or(nan, hn::IsNaN(x));
    } else {
      const auto index = hn::Add(iota, hn::Set(di, static_cast<int32_t>(i)));
      if (sp.alibi) {  // + slope * (t - pos), t = t0 + index.
        const VF distance = hn::ConvertTo(
            df, hn::Add(index, hn::Set(di, static_cast<int32_t>(keys.t0 - keys.pos))));
        x = hn::MulAdd(hn::Set(df, keys.alibi_slope), distance, x);
      }
      auto valid = hn::RebindMask(df, hn::Lt(index, hn::Set(di, static_cast<int32_t>(needed))));
      if (keys.bits != nullptr) {
        valid = hn::And(valid, KeptLanes(keys.bits, keys.bit0 + i));
        kept = hn::Or(kept, valid);
      }
      nan = hn::Or(nan, hn::And(valid, hn::IsNaN(x)));
      if (sp.soft_cap != 0.0f) {
        const VF cap = hn::Set(df, sp.soft_cap);
        x = hn::Mul(cap, hn::Tanh(df, hn::Div(x, cap)));
      }
      if (any_masked) {
        const auto t = hn::Add(index, hn::Set(di, static_cast<int32_t>(t0)));
        const auto masked = hn::Or(hn::Lt(t, hn::Set(di, static_cast<int32_t>(begin))),
                                   hn::Gt(t, hn::Set(di, static_cast<int32_t>(end - 1))));
        const auto masked_f = hn::RebindMask(df, masked);
        // mask_value -inf is added like the reference does, so a masked +inf
        // logit becomes NaN there too (it poisons the row, as in the
        // reference); other vanishing masks give exactly -inf.
        x = sp.vanish && sp.mask_value != -std::numeric_limits<float>::infinity()
                ? hn::IfThenElse(masked_f, neg_inf, x)
                : hn::IfThenElse(masked_f, hn::Add(x, hn::Set(df, sp.mask_value)), x);
        nan = hn::Or(nan, hn::And(valid, hn::IsNaN(x)));
      }
      x = hn::IfThenElse(valid, x, neg_inf);
    }
    hn::StoreU(x, df, s + i);
    vmax = hn::Max(vmax, x);
  };
  int64_t key = 0;
  if (!sp.alibi && keys.bits == nullptr && sp.soft_cap == 0.0f && !any_masked) {
    for (; key + lanes <= needed; key += lanes) logits.template operator()<true>(key);
  }
  for (; key < read_pad; key += lanes) logits.template operator()<false>(key);
  const float m_old = *m;
  const float m_new = std::max(m_old, hn::GetLane(hn::MaxOfLanes(df, vmax)));
  if (std::isnan(m_old) || !hn::AllFalse(df, nan) ||
      m_new == std::numeric_limits<float>::infinity()) {
    // A NaN logit, or a +inf one (exp(inf - inf)), makes the row NaN in the
    // reference (docs/contract.md §1: NaN in valid data propagates): poison the state;
    // m stays NaN, so later tiles come here too, and the output is NaN.
    for (int64_t i = 0; i < n_pad; ++i) s[i] = 0.0f;
    *m = std::numeric_limits<float>::quiet_NaN();
    *l = std::numeric_limits<float>::quiet_NaN();
    for (int64_t d = 0; d < dim_pad; ++d) acc[d] = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  if (m_new == -std::numeric_limits<float>::infinity()) {
    // No key of this row visible yet, or only keys whose logit is -inf:
    // weights 0, state unchanged. If the reference's maximum over the row
    // is then -inf too, its output is exp(-inf - -inf) = NaN, unless a later
    // key is finite: l = -0 marks that (checked at the end). That is so when
    // every key takes part (an additive mask_value: masked keys are logit +
    // mask_value, -inf here too) or, with masked keys vanishing, when a
    // visible key was in the tile and either mask_value is -inf or the row
    // masks no key at all. (Otherwise a finite mask_value <= -1e4 makes the
    // reference weigh the masked keys instead; those may be skipped, docs/contract.md §1.)
    // A custom mask's dropped keys take no part: the tile must keep one.
    const bool participates = keys.bits == nullptr || !hn::AllFalse(df, kept);
    const bool visible = std::min(t0 + n, end) > std::max(t0, begin);
    const bool masks_none = begin <= 0 && end >= kv_len;
    if (participates &&
        ((!sp.vanish && n > 0) ||
         (visible && (masks_none || sp.mask_value == -std::numeric_limits<float>::infinity())))) {
      *l = -0.0f;
    }
    for (int64_t i = 0; i < n_pad; ++i) s[i] = 0.0f;
    return;
  }
  const VF vm = hn::Set(df, m_new);
  VF vsum = hn::Zero(df);
  for (int64_t i = 0; i < read_pad; i += lanes) {
    const VF x = hn::LoadU(df, s + i);
    const VF p = ExpNonPositive(df, hn::Sub(x, vm));  // exp(-inf) = 0 for masked keys.
    vsum = hn::Add(vsum, p);
    hn::StoreU(p, df, s + i);
  }
  for (int64_t i = read_pad; i < n_pad; i += lanes) hn::StoreU(hn::Zero(df), df, s + i);
  // Most rows of a chunked prefill see a single tile: no rescale.
  const float alpha = MoveToReference(m_new, hn::GetLane(hn::SumOfLanes(df, vsum)), m, l);
  if (alpha != 1.0f) {
    const VF va = hn::Set(df, alpha);
    for (int64_t d = 0; d < dim_pad; d += lanes) {
      hn::StoreU(hn::Mul(hn::LoadU(df, acc + d), va), df, acc + d);
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace rpa::internal
HWY_AFTER_NAMESPACE();

#endif  // RPA_SRC_KERNEL_SOFTMAX_INL_H_
