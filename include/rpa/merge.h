// Merging partial attentions over disjoint key sets (cascade / shared-prefix
// attention, context parallelism), from their outputs and log-sum-exps.
#ifndef RPA_MERGE_H_
#define RPA_MERGE_H_

#include "rpa/tensor.h"

namespace rpa {

// out = (exp(lse_a) * out_a + exp(lse_b) * out_b) / (exp(lse_a) + exp(lse_b)),
// lse = log(exp(lse_a) + exp(lse_b)), computed stably in f32. A row whose
// two LSEs are both -inf (no key on either side) gets output 0 and LSE -inf.
//   out_a, out_b, out  [num_tokens, num_heads, head_dim]  one of f32/bf16/f16
//   lse_a, lse_b, lse  f32[num_tokens, num_heads]
// `out` and `lse` may alias `out_a` and `lse_a` (in-place merge).
void MergeStates(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                 const TensorView& lse_b, const MutableTensorView& out,
                 const MutableTensorView& lse);

}  // namespace rpa

#endif  // RPA_MERGE_H_
