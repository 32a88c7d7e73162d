// The production computation behind every entry point, on a validated
// problem. Writes every row of problem.out (zeros for padding rows).
#ifndef RPA_SRC_COMPUTE_H_
#define RPA_SRC_COMPUTE_H_

#include <string>

#include "problem.h"

namespace rpa::internal {

void ComputeAttention(const AttentionProblem& problem);

// The kernels ComputeAttention runs for this problem on this thread, per
// class of task it has: "decode: avx512_wide_decode > avx512_wide".
std::string DescribeKernels(const AttentionProblem& problem);

}  // namespace rpa::internal

#endif  // RPA_SRC_COMPUTE_H_
