// Entry points of ragged paged attention (docs/contract.md §1, §2).
//
// Every entry point validates its inputs first (rpa/validate.h) and throws
// rpa::Error before writing anything; on success `out` holds the attention
// of every token row and zeros in padding rows. Inputs are never written.
#ifndef RPA_ATTENTION_H_
#define RPA_ATTENTION_H_

#include <string_view>

#include "rpa/export.h"
#include "rpa/options.h"
#include "rpa/page_table.h"
#include "rpa/tensor.h"

namespace rpa {

// How separate K and V caches lay out their pages (docs/contract.md §2).
enum class KVLayout {
  kNHD,  // [num_pages, page_size, num_kv_heads, head_dim] (vLLM, FlashInfer).
  kHND,  // [num_pages, num_kv_heads, page_size, head_dim] (FlashInfer).
};

constexpr std::string_view ToString(KVLayout layout) {
  return layout == KVLayout::kNHD ? "NHD" : "HND";
}

// Separate K and V caches of equal shape and dtype in `layout`.
struct KVPages {
  TensorView k_pages;
  TensorView v_pages;
  KVLayout layout = KVLayout::kNHD;
};

// JAX's combined layout.
//   q            [max_num_batched_tokens, num_q_heads, head_dim]  f32/bf16/f16
//   kv_pages     [total_num_pages, page_size, 2 * num_kv_heads, head_dim];
//                combined head 2h is K of kv head h, 2h + 1 its V
//   page_table   JAX's kv_lens, page_indices, cu_q_lens and num_seqs (page_table.h)
//   out          like q
RPA_EXPORT void RaggedPagedAttention(const TensorView& q, const TensorView& kv_pages,
                                     const PageTable& page_table, const AttentionOptions& options,
                                     const MutableTensorView& out);

// The same over separate K and V caches.
RPA_EXPORT void RaggedPagedAttention(const TensorView& q, const KVPages& kv,
                                     const PageTable& page_table, const AttentionOptions& options,
                                     const MutableTensorView& out);

// JAX's decode-only paged_attention: one query token per sequence.
//   q             [batch, num_q_heads, head_dim] (pre-scaled: no sm_scale)
//   k_pages       [num_kv_heads, total_num_pages, page_size, head_dim]
//   v_pages       like k_pages
//   lengths       i32[batch]
//   page_indices  i32[batch, pages_per_sequence]
//   out           like q
RPA_EXPORT void PagedAttention(const TensorView& q, const TensorView& k_pages,
                               const TensorView& v_pages, const TensorView& lengths,
                               const TensorView& page_indices, const PagedAttentionOptions& options,
                               const MutableTensorView& out);

}  // namespace rpa

#endif  // RPA_ATTENTION_H_
