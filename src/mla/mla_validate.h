// Every check of an MLA plan and run (rpa/mla.h), each message naming the
// argument and its value, then saying how to fix it. Nothing here writes
// anything the caller passed.
#ifndef RPA_SRC_MLA_MLA_VALIDATE_H_
#define RPA_SRC_MLA_MLA_VALIDATE_H_

#include "mla/mla_problem.h"
#include "rpa/mla.h"
#include "rpa/tensor.h"

namespace rpa::internal {

// The shape's extents and dtypes and the options (kShape, kDtype, kOption);
// describes the problem's extents and options (num_threads resolved).
MlaProblem ValidateMlaPlan(const MlaShape& shape, const MlaOptions& options);

// The page table's views (rank, int32, contiguous) and values, copied into
// `copy` and checked there (kShape, kDtype, kLayout, kMetadata, kPageIndex);
// points the problem at the copy and sets num_seqs and num_tokens.
void CopyMlaPageTable(const MlaPageTable& table, MlaProblem& problem, MlaMetadata& copy);

// The tensors of one run.
struct MlaRunViews {
  TensorView q_nope, q_pe, ckv_cache, kpe_cache;
  MutableTensorView out;
};

// Checks a run's views and extras against the planned problem and binds
// them into it (kShape, kDtype, kLayout, kOption).
void BindMlaRun(const MlaRunViews& views, const MlaRunExtras& extras, MlaProblem& problem);

}  // namespace rpa::internal

#endif  // RPA_SRC_MLA_MLA_VALIDATE_H_
