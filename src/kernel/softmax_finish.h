// The state rules of a row's online softmax, written once: moving it to a
// new reference (the unfused softmax and avx512_bf16_packed's fused one),
// and its end, for the task loop (rows a task owns whole) and the merge of
// split tasks (rows whose keys several tasks shared).
//
// The state (m, l) of a row: m the largest logit seen, l the sum of
// e^(logit - m). Special values, as the softmax writes them (softmax-inl.h):
//   l == +0: no key visible (output 0, LSE -inf);
//   l == -0: every key's logit was -inf where the reference's shift is then
//            exp(-inf - -inf) = NaN (output NaN, LSE NaN);
//   m, l NaN: a NaN or +inf logit poisoned the row (output NaN, LSE NaN).
// A sink joins the denominator only (docs/contract.md §1), in the frame of
// m; a finite sink bounds the reference's shift, so an l == -0 row is then
// 0, not NaN.
#ifndef RPA_SRC_KERNEL_SOFTMAX_FINISH_H_
#define RPA_SRC_KERNEL_SOFTMAX_FINISH_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace rpa::internal {

struct FinishedRow {
  float out_scale;  // Multiplies the accumulator row into the output row.
  float lse;        // The row's log-sum-exp (natural log).
};

// The row's (m, l) moved to the reference m_new (>= m, finite) after a
// tile's weights e^(logit - m_new) summing to `sum`. Returns the factor its
// accumulator must be multiplied by, 1 where it must stay: before the first
// finite reference every weight was 0, so the accumulator holds 0 (or NaN
// from 0 x NaN, which a product by 0 would keep), and l (0, or -0 marking a
// row of -inf logits) is replaced by the sum.
inline float MoveToReference(float m_new, float sum, float* m, float* l) {
  const float m_old = *m;
  *m = m_new;
  if (m_old == -std::numeric_limits<float>::infinity()) {
    *l = sum;
    return 1.0f;
  }
  const float alpha = std::exp(m_old - m_new);
  *l = *l * alpha + sum;
  return alpha;
}

// sink: the row's q head's sink logit, or null; v_scale: the V scale (and
// whatever unit the accumulator is in).
inline FinishedRow FinishRow(float m, float l, const float* sink, float v_scale) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const bool finite_sink = sink != nullptr && *sink != -kInf;
  const bool nan_row = l == 0.0f && std::signbit(l) && !finite_sink;
  if (nan_row) return {kNaN, kNaN};
  if (l == 0.0f) return {0.0f, -kInf};
  const float denominator = sink != nullptr ? l + std::exp(*sink - m) : l;
  return {v_scale / denominator, m + std::log(l)};
}

// The merged (m, l) of row r over the partials of a split row, each
// [rows] m, [rows] l, then the accumulator rows, part_of(c) pointing at
// partial c: m the largest partial maximum (NaN if any is), l the partials'
// sums in that frame; l = -0 where no partial had a finite logit and one of
// them marked the row NaN (l == -0 above).
struct MergedRow {
  float m = -std::numeric_limits<float>::infinity();
  float l = 0.0f;
};

template <class PartOf>
MergedRow MergeRowState(int32_t num_parts, const PartOf& part_of, int64_t rows, int64_t r) {
  MergedRow merged;
  bool nan_marked = false;
  for (int32_t c = 0; c < num_parts; ++c) {
    const float* part = part_of(c);
    const float mc = part[r];
    merged.m = std::isnan(mc) || std::isnan(merged.m) ? std::numeric_limits<float>::quiet_NaN()
                                                      : std::max(merged.m, mc);
    nan_marked = nan_marked || (part[rows + r] == 0.0f && std::signbit(part[rows + r]));
  }
  if (merged.m == -std::numeric_limits<float>::infinity()) {
    merged.l = nan_marked ? -0.0f : 0.0f;
    return merged;
  }
  for (int32_t c = 0; c < num_parts; ++c) {
    const float* part = part_of(c);
    merged.l += std::exp(part[r] - merged.m) * part[rows + r];
  }
  return merged;
}

// The weight of a partial whose maximum is m_c in the merged row: 0 where no
// partial had a finite logit (its accumulator is still added: NaN where a V
// element is infinite, 0 * inf, as in the reference).
inline float MergeWeight(const MergedRow& merged, float m_c) {
  return merged.m == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(m_c - merged.m);
}

}  // namespace rpa::internal

#endif  // RPA_SRC_KERNEL_SOFTMAX_FINISH_H_
