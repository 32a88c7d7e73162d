// The host-side plan of MLA runs (rpa::MlaPlan): tasks of up to
// kMlaMaxRows rows (query tokens x every head) of one sequence over its
// visible keys, costliest first from one shared counter; when the batch has
// too few tasks for the threads (few long sequences), a task's keys are
// split on KV-tile boundaries into chunks that write partial (m, l, acc),
// merged by log-sum-exp afterwards (flash-decoding), as src/plan.h does for
// attention. The plan depends only on the page table, the shape and the
// thread count, so a run's bytes are the same every time.
#ifndef RPA_SRC_MLA_MLA_PLAN_H_
#define RPA_SRC_MLA_MLA_PLAN_H_

#include <cstdint>
#include <vector>

#include "mla/mla_kernel.h"
#include "mla/mla_problem.h"

namespace rpa::internal {

struct MlaTasks {
  int64_t q_tile = 0;  // Query tokens per task: kMlaMaxRows / num_heads.
  MlaScratchShape scratch;
  const MlaKernel* kernel = nullptr;
  int num_workers = 1;
  std::vector<MlaTask> tasks;     // [num_tasks] by sequence, q tile, chunk.
  std::vector<int32_t> order;     // [num_tasks] task indices, costliest first.
  std::vector<int64_t> costs;     // [num_tasks] rows x keys plus a fixed cost.
  std::vector<MlaMerge> merges;   // Split query tiles.
  int64_t partial_floats = 0;
  std::vector<MlaTask> whole;     // Scratch of BuildMlaTasks: the unsplit tasks.
  std::vector<int64_t> whole_costs;
};

// Fills `tasks` (reusing its storage) for the problem's threads, with the
// kernel chosen for the CPU features usable on this thread.
void BuildMlaTasks(const MlaProblem& problem, MlaTasks& tasks);

// What an MlaPlan holds.
struct MlaPlanState {
  MlaProblem problem;  // Its metadata point into `metadata`; tensors bound per run, on a copy.
  MlaMetadata metadata;
  MlaTasks tasks;
};

// Runs the planned tasks of a problem whose tensors are bound, then the
// merges. Several threads may run one plan at once.
void RunMlaTasks(const MlaProblem& problem, const MlaTasks& tasks);

}  // namespace rpa::internal

#endif  // RPA_SRC_MLA_MLA_PLAN_H_
