// A ragged batch's page table in JAX's form: which keys each sequence has
// and where their pages are (docs/contract.md §1, §2). Every entry point and
// the validation take one; the four views stay the caller's.
#ifndef RPA_PAGE_TABLE_H_
#define RPA_PAGE_TABLE_H_

#include "rpa/tensor.h"

namespace rpa {

struct PageTable {
  // i32[max_num_seqs]: keys of each sequence, this step's new tokens included.
  TensorView kv_lens;
  // i32[max_num_seqs, pages_per_seq]: the pages of each sequence, in order;
  // only the first ceil(kv_len / page_size) of a live sequence are read.
  TensorView page_indices;
  // i32[max_num_seqs + 1]: sequence i's query rows are [cu_q_lens[i], cu_q_lens[i+1]).
  TensorView cu_q_lens;
  // i32[1]: the live sequences, a prefix of the max_num_seqs slots.
  TensorView num_seqs;
};

}  // namespace rpa

#endif  // RPA_PAGE_TABLE_H_
