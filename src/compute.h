// The production computation behind every entry point, on a validated
// problem. Writes every row of problem.out (zeros for padding rows).
#ifndef RPA_SRC_COMPUTE_H_
#define RPA_SRC_COMPUTE_H_

#include "problem.h"

namespace rpa::internal {

void ComputeAttention(const AttentionProblem& problem);

}  // namespace rpa::internal

#endif  // RPA_SRC_COMPUTE_H_
