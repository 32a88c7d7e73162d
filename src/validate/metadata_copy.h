// A plan's own copy of the page table it validated: what its runs read, so
// a caller who changes or frees its arrays after planning cannot make a run
// read out of bounds. Every form of page table (JAX's padded matrix,
// FlashInfer's CSR) becomes this compact one, holding only the pages the
// live sequences read. The vectors only grow: re-planning reuses them.
#ifndef RPA_SRC_VALIDATE_METADATA_COPY_H_
#define RPA_SRC_VALIDATE_METADATA_COPY_H_

#include <cstdint>
#include <vector>

#include "problem.h"

namespace rpa::internal {

struct MetadataCopy {
  std::vector<int32_t> kv_lens;       // [num_seqs]
  std::vector<int32_t> cu_q_lens;     // [num_seqs + 1]
  std::vector<int32_t> page_indices;  // [pages read]: sequence i's from page_begin[i] on
  std::vector<int64_t> page_begin;    // [num_seqs + 1]
  std::vector<float> alibi_slopes;    // [num_q_heads] when the problem has them
  std::vector<uint8_t> mask_bits;     // The custom mask, packed (AttentionProblem::mask_bits).
  std::vector<int64_t> mask_begin;    // [num_seqs]

  // Points the problem's metadata here.
  void Bind(AttentionProblem& p) const {
    p.kv_lens = kv_lens.data();
    p.cu_q_lens = cu_q_lens.data();
    p.page_indices = page_indices.data();
    p.page_begin = page_begin.data();
  }

  // The options' arrays a plan keeps its own copy of (ALiBi slopes, the
  // custom mask, checked against the copied lengths: validate.cc): copied
  // here and the problem pointed at the copies.
  void CopyOptionArrays(AttentionProblem& p);
};

}  // namespace rpa::internal

#endif  // RPA_SRC_VALIDATE_METADATA_COPY_H_
