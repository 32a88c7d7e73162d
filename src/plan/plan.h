// The host-side plan of one attention call: tile sizes, the tasks the kernel
// runs and the merges of split tasks. Plan, then run: the run only computes.
//
// Tasks are (sequence, kv head, query tile, KV chunk). The cost model counts
// q.k products (rows x keys) plus a per-task overhead; tasks run largest
// first from one shared counter (longest-processing-time order), which keeps
// threads balanced when sequence lengths differ. When the batch has too few
// tasks for the threads (one long decode sequence), a task's KV range is
// split into chunks that write partial (m, l, acc) and a merge combines
// them by log-sum-exp (flash-decoding). The plan depends only on the problem
// and the thread count, so results are identical run to run.
#ifndef RPA_SRC_PLAN_PLAN_H_
#define RPA_SRC_PLAN_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernel/dispatch.h"
#include "kernel/scratch.h"
#include "kernel/task.h"
#include "problem.h"

namespace rpa::internal {

// Partials of one query tile of one kv head, split over consecutive tasks.
struct MergeGroup {
  int32_t first_task = 0;  // Index into Plan::tasks.
  int32_t num_tasks = 0;
};

struct Plan {
  int64_t q_tile = 0;           // Query tokens per tile.
  int64_t pages_per_block = 0;  // KV tile in pages ...
  int64_t kv_block = 0;         // ... and in keys.
  ScratchShape scratch;         // Each worker's scratch (rows: the most of any task).
  int num_workers = 1;
  // The kernels of each class of task (dispatch.h), and which classes the
  // tasks use: Describe() names the kernels the call runs.
  KernelChoice kernels;
  bool class_used[kNumTaskClasses] = {};
  std::vector<KernelTask> tasks;   // [num_tasks] by sequence, q tile, kv head, chunk.
  std::vector<int32_t> order;      // [num_tasks] task indices, costliest first.
  std::vector<int64_t> costs;      // [num_tasks] cost-model units.
  std::vector<MergeGroup> merges;  // Split query tiles.
  int64_t partial_floats = 0;      // Size of the partial buffer.
  // E.g. "decode: avx512_wide_decode > avx512_wide"; classes joined by "; ".
  std::string DescribeKernels() const;
  // Scratch of BuildPlan: the unsplit tasks.
  std::vector<KernelTask> whole_tasks;
  std::vector<int64_t> whole_costs;
};

// Tile sizes: the problem's when given, else the defaults below, clamped to
// [1, pages_per_seq] and shrunk to fit vmem_limit_bytes when that is given.
struct TileSizes {
  int64_t q_tile = 0;
  int64_t pages_per_block = 0;
};
TileSizes ChooseTileSizes(const AttentionProblem& problem);

// Fills `plan` (reusing its vectors' storage) for num_threads threads, the
// kernels chosen for the CPU features usable on this thread.
void BuildPlan(const AttentionProblem& problem, int num_threads, Plan& plan);

}  // namespace rpa::internal

#endif  // RPA_SRC_PLAN_PLAN_H_
