#include "rpa/attention.h"

#include <vector>

#include "compute.h"
#include "validate_internal.h"

namespace rpa {

void RaggedPagedAttention(const TensorView& q, const TensorView& kv_pages,
                          const PageTable& page_table, const AttentionOptions& options,
                          const MutableTensorView& out) {
  internal::ComputeAttention(
      internal::ValidateRagged(internal::CombinedInputs(q, kv_pages, page_table), options, out));
}

void RaggedPagedAttention(const TensorView& q, const KVPages& kv, const PageTable& page_table,
                          const AttentionOptions& options, const MutableTensorView& out) {
  internal::ComputeAttention(
      internal::ValidateRagged(internal::SplitInputs(q, kv, page_table), options, out));
}

void PagedAttention(const TensorView& q, const TensorView& k_pages, const TensorView& v_pages,
                    const TensorView& lengths, const TensorView& page_indices,
                    const PagedAttentionOptions& options, const MutableTensorView& out) {
  std::vector<int32_t> cu_q_lens;
  internal::ComputeAttention(internal::ValidatePagedAttention(
      q, k_pages, v_pages, lengths, page_indices, options, out, cu_q_lens));
}

}  // namespace rpa
