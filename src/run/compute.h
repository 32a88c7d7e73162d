// The production computation behind every entry point: a plan's tasks run
// on a validated problem. Writes every row of problem.out (zeros for
// padding rows).
#ifndef RPA_SRC_RUN_COMPUTE_H_
#define RPA_SRC_RUN_COMPUTE_H_

#include <string>

#include "plan/plan.h"
#include "problem.h"

namespace rpa::internal {

// Runs `plan` (BuildPlan of this problem's metadata) on the problem's
// tensors. Several threads may run one plan at once.
void RunPlan(const AttentionProblem& problem, const Plan& plan);

// Plans (in the calling thread's storage) and runs: for tests and tools that
// hold a validated problem; the entry points plan once (plan_state.h).
void ComputeAttention(const AttentionProblem& problem);

// The kernels ComputeAttention runs for this problem on this thread, per
// class of task it has: "decode: avx512_wide_decode > avx512_wide".
std::string DescribeKernels(const AttentionProblem& problem);

}  // namespace rpa::internal

#endif  // RPA_SRC_RUN_COMPUTE_H_
