// The end of a row's online softmax, written once for the task loop (rows a
// task owns whole) and the merge of split tasks (rows whose keys several
// tasks shared).
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

#include <cmath>
#include <limits>

namespace rpa::internal {

struct FinishedRow {
  float out_scale;  // Multiplies the accumulator row into the output row.
  float lse;        // The row's log-sum-exp (natural log).
};

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

}  // namespace rpa::internal

#endif  // RPA_SRC_KERNEL_SOFTMAX_FINISH_H_
