// Merging partial attentions over disjoint key sets (cascade / shared-prefix
// attention, context parallelism), from their outputs and log-sum-exps.
#ifndef RPA_MERGE_H_
#define RPA_MERGE_H_

#include "rpa/export.h"
#include "rpa/tensor.h"

namespace rpa {

// The base of a log-sum-exp. rpa's LSE outputs (AttentionOptions::lse,
// RunExtras::lse) are natural logs; FlashInfer's default is base 2
// (log2(sum 2^(logit * log2(e)))): lse_2 = lse_e * log2(e).
enum class LseBase { kE, k2 };

// out = (b^lse_a * out_a + b^lse_b * out_b) / (b^lse_a + b^lse_b),
// lse = log_b(b^lse_a + b^lse_b) for the base b of `base` (e: rpa's LSEs,
// 2: FlashInfer's), computed stably in f32. A row whose two LSEs are both
// -inf (no key on either side) gets output 0 and LSE -inf.
//   out_a, out_b, out  [num_tokens, num_heads, head_dim]  one of f32/bf16/f16
//   lse_a, lse_b, lse  f32[num_tokens, num_heads]
// `out` and `lse` may alias `out_a` and `lse_a` (in-place merge).
RPA_EXPORT void MergeStates(const TensorView& out_a, const TensorView& lse_a,
                            const TensorView& out_b, const TensorView& lse_b,
                            const MutableTensorView& out,
                            const MutableTensorView& lse, LseBase base = LseBase::kE);

}  // namespace rpa

#endif  // RPA_MERGE_H_
