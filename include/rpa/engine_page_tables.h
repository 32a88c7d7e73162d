// Engines' page tables beside JAX's (rpa/page_table.h): FlashInfer's CSR
// form, which AttentionPlan accepts natively (no padded matrix is built),
// and vLLM's attention metadata, which is JAX's form without a copy.
#ifndef RPA_ENGINE_PAGE_TABLES_H_
#define RPA_ENGINE_PAGE_TABLES_H_

#include "rpa/export.h"
#include "rpa/page_table.h"
#include "rpa/tensor.h"

namespace rpa {

// FlashInfer's paged-KV page table, every array int32, all batch_size
// sequences live:
//   sequence i's query rows   [qo_indptr[i], qo_indptr[i+1])
//   its pages                 kv_indices[kv_indptr[i] .. kv_indptr[i+1]), in order
//   its kv_len                (pages - 1) * page_size + kv_last_page_len[i], 0 without pages
// FlashInfer's rules are checked (docs/contract.md §3.3): both indptrs start
// at 0 and never decrease, kv_indptr[batch_size] <= kv_indices.shape[0],
// 1 <= kv_last_page_len[i] <= page_size for a sequence with pages (0 for one
// without), every index in [0, num_pages), and rpa's q_len <= kv_len.
struct CsrPageTable {
  TensorView qo_indptr;         // i32[batch_size + 1]
  TensorView kv_indptr;         // i32[batch_size + 1]
  TensorView kv_indices;        // i32[>= kv_indptr[batch_size]]
  TensorView kv_last_page_len;  // i32[batch_size]
};

// vLLM's attention metadata as JAX's page table, without copying:
// seq_lens is kv_lens, block_table page_indices, query_start_loc cu_q_lens.
// block_table and query_start_loc may have more rows than seq_lens (vLLM's
// persistent buffers): only the first seq_lens.shape[0] (+ 1) are used.
//   query_start_loc  i32[>= num_reqs + 1]
//   seq_lens         i32[num_reqs]
//   block_table      i32[>= num_reqs, max_num_blocks_per_req]
//   num_seqs         i32[1]: the live requests (<= num_reqs)
RPA_EXPORT PageTable VllmPageTable(const TensorView& query_start_loc, const TensorView& seq_lens,
                                   const TensorView& block_table, const TensorView& num_seqs);

}  // namespace rpa

#endif  // RPA_ENGINE_PAGE_TABLES_H_
