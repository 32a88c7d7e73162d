// The split-KV merge: a query tile whose keys the plan split into several
// tasks (flash decoding) gets its output rows from their partial states.
#ifndef RPA_SRC_RUN_SPLIT_MERGE_H_
#define RPA_SRC_RUN_SPLIT_MERGE_H_

#include "plan/plan.h"
#include "problem.h"

namespace rpa::internal {

// Writes the output (and LSE) rows of `group`'s query tile from its tasks'
// partials (each at its KernelTask::partial_offset: m [rows], l [rows], acc
// [rows][RoundUp(head_dim, kDimAlign)]).
void MergeGroupRows(const AttentionProblem& p, const Plan& plan, const MergeGroup& group,
                    const float* partials);

}  // namespace rpa::internal

#endif  // RPA_SRC_RUN_SPLIT_MERGE_H_
