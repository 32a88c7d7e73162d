// Fused KV-cache write: store the step's new keys and values into their
// pages, then attend, in one call.
#ifndef RPA_KV_CACHE_H_
#define RPA_KV_CACHE_H_

#include "rpa/attention.h"
#include "rpa/export.h"
#include "rpa/options.h"
#include "rpa/tensor.h"

namespace rpa {

// The new tokens of sequence i are its last q_len positions: row
// cu_q_lens[i] + j of new_k / new_v is the key / value of position
// kv_len - q_len + j, written to page page_indices[i][p / page_size], slot
// p % page_size. Stored as x / k_scale (x / v_scale) when a scale is given,
// rounded and (fp8, int8) saturated to the cache's dtype. Everything is
// validated before the first write: on error the cache and out are
// untouched. Slots this step does not write stay bit-identical.
//   new_k, new_v  [max_num_batched_tokens, num_kv_heads, head_dim], any KV dtype
// The other arguments are RaggedPagedAttention's.
RPA_EXPORT void RaggedPagedAttentionWithKVWrite(const TensorView& q, const TensorView& new_k,
                                                const TensorView& new_v,
                                                const MutableTensorView& kv_pages,
                                                const PageTable& page_table,
                                                const AttentionOptions& options,
                                                const MutableTensorView& out);

// Separate K and V caches the write stores into.
struct MutableKVPages {
  MutableTensorView k_pages;
  MutableTensorView v_pages;
  KVLayout layout = KVLayout::kNHD;
};

RPA_EXPORT void RaggedPagedAttentionWithKVWrite(const TensorView& q, const TensorView& new_k,
                                                const TensorView& new_v,
                                                const MutableKVPages& kv,
                                                const PageTable& page_table,
                                                const AttentionOptions& options,
                                                const MutableTensorView& out);

}  // namespace rpa

#endif  // RPA_KV_CACHE_H_
