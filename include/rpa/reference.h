// The reference implementation: the oracle every other path is tested
// against (docs/contract.md §1). One sequence at a time, f64 accumulation, no tiling;
// validates exactly as the fast entry points do. Slow by design.
#ifndef RPA_REFERENCE_H_
#define RPA_REFERENCE_H_

#include "rpa/attention.h"
#include "rpa/options.h"
#include "rpa/tensor.h"

namespace rpa {

void RefRaggedPagedAttention(const TensorView& q, const TensorView& kv_pages,
                             const TensorView& kv_lens, const TensorView& page_indices,
                             const TensorView& cu_q_lens, const TensorView& num_seqs,
                             const AttentionOptions& options, const MutableTensorView& out);

void RefRaggedPagedAttention(const TensorView& q, const TensorView& k_pages,
                             const TensorView& v_pages, KVLayout layout,
                             const TensorView& kv_lens, const TensorView& page_indices,
                             const TensorView& cu_q_lens, const TensorView& num_seqs,
                             const AttentionOptions& options, const MutableTensorView& out);

}  // namespace rpa

#endif  // RPA_REFERENCE_H_
