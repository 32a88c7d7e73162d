#include "plan/plan.h"

#include <algorithm>
#include <iterator>
#include <numeric>
#include <optional>

#include "plan/block_sizes_internal.h"
#include "rpa/block_sizes.h"

namespace rpa::internal {
namespace {

// A task's fixed cost (q load, output store, tile setup) in cost units.
constexpr int64_t kTaskOverhead = 2048;
// Split long KV ranges until every thread has about this many tasks.
constexpr int64_t kTasksPerThread = 4;
int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::string Plan::DescribeKernels() const {
  std::string s;
  for (int c = 0; c < kNumTaskClasses; ++c) {
    if (!class_used[c]) continue;
    if (!s.empty()) s += "; ";
    s += std::string(ToString(static_cast<TaskClass>(c))) + ": " + kernels.classes[c].Describe();
  }
  return s.empty() ? "none" : s;
}

TileSizes ChooseTileSizes(const AttentionProblem& problem) {
  // Sizes the caller left out come from the block-size chooser (docs/contract.md §4:
  // tuned table, nearest entry, or the cache heuristic), which also fits
  // them into vmem_limit_bytes.
  // A caller who fixed one size gets the other refitted around it: the
  // chooser fitted its own pair.
  const bool caller_pages = problem.num_kv_pages_per_block > 0;
  const bool caller_queries = problem.num_queries_per_block > 0;
  // A query tile taller than the batch computes nothing more; capping it
  // keeps a huge (valid) num_queries_per_block from sizing huge scratch.
  const int64_t max_q_tile = std::max<int64_t>(problem.num_tokens, 1);
  BlockSizes sizes{problem.num_kv_pages_per_block,
                   std::min(problem.num_queries_per_block, max_q_tile)};
  if (!caller_pages || !caller_queries) {
    const BlockSizeConfig config{problem.q_dtype,      problem.kv_dtype,
                                 problem.num_q_heads,  problem.num_kv_heads,
                                 problem.head_dim,     problem.page_size,
                                 problem.num_tokens,   problem.page_size * problem.pages_per_seq};
    const std::optional<int64_t> vmem =
        problem.vmem_limit_bytes > 0 ? std::optional<int64_t>(problem.vmem_limit_bytes)
                                     : std::nullopt;
    const BlockSizes chosen = ChooseBlockSizes(config, vmem).sizes;
    if (!caller_pages) sizes.num_kv_pages_per_block = chosen.num_kv_pages_per_block;
    if (!caller_queries) sizes.num_queries_per_block = chosen.num_queries_per_block;
    if (caller_pages || caller_queries) {
      std::string note;
      sizes = FitBlockSizes(config, sizes, vmem, note, caller_pages, caller_queries);
    }
  }
  TileSizes tiles;
  tiles.q_tile = std::clamp<int64_t>(sizes.num_queries_per_block, 1, max_q_tile);
  tiles.pages_per_block = sizes.num_kv_pages_per_block;
  return tiles;
}

void BuildPlan(const AttentionProblem& problem, int num_threads, Plan& plan) {
  const TileSizes tiles = ChooseTileSizes(problem);
  const int64_t group = problem.QueriesPerKvHead();
  plan.q_tile = tiles.q_tile;
  plan.pages_per_block = tiles.pages_per_block;
  plan.kv_block = tiles.pages_per_block * problem.page_size;
  plan.scratch = {.q_tile = plan.q_tile,
                  .kv_block = plan.kv_block,
                  .group = group,
                  .num_kv_heads = problem.num_kv_heads,
                  .head_dim = problem.head_dim,
                  .kv_dtype = problem.kv_dtype};
  plan.kernels = ChooseKernels(problem, UsableCpuFeatures());
  std::fill(std::begin(plan.class_used), std::end(plan.class_used), false);
  plan.tasks.clear();
  plan.order.clear();
  plan.costs.clear();
  plan.merges.clear();
  plan.partial_floats = 0;

  const bool vanish = problem.MaskedKeysVanish();
  const int64_t kv_block = plan.kv_block;
  // Whole query tiles first; their total cost sets the split size.
  std::vector<KernelTask>& whole = plan.whole_tasks;
  std::vector<int64_t>& whole_costs = plan.whole_costs;
  whole.clear();
  whole_costs.clear();
  int64_t total_cost = 0;
  for (int32_t seq = 0; seq < problem.num_seqs; ++seq) {
    const int64_t q_len = problem.cu_q_lens[seq + 1] - problem.cu_q_lens[seq];
    const int64_t kv_len = problem.kv_lens[seq];
    for (int64_t qb = 0; qb < q_len; qb += plan.q_tile) {
      const int64_t qe = std::min(q_len, qb + plan.q_tile);
      // Keys any row of the tile sees; with a vanishing mask, the keys
      // outside are skipped whole (causal: after the last row's position;
      // window: at or before the first row's position - window).
      int64_t lo = 0, hi = kv_len;
      if (vanish) {
        hi = std::clamp<int64_t>(problem.VisibleKeys(kv_len - q_len + qe - 1, kv_len).end, 0,
                                 kv_len);
        lo = std::clamp<int64_t>(problem.VisibleKeys(kv_len - q_len + qb, kv_len).begin, 0, hi);
      }
      // Tiles of few rows per kv head take every kv head in one task: K/V
      // are then read whole token rows at a time (kMultiHeadMaxRows).
      const int32_t heads_per_task = (qe - qb) * group <= kMultiHeadMaxRows
                                         ? static_cast<int32_t>(problem.num_kv_heads)
                                         : 1;
      for (int32_t h = 0; h < problem.num_kv_heads; h += heads_per_task) {
        KernelTask task;
        task.seq = seq;
        task.kv_head = h;
        task.kv_head_end = h + heads_per_task;
        task.q_begin = static_cast<int32_t>(qb);
        task.q_end = static_cast<int32_t>(qe);
        task.kv_begin = static_cast<int32_t>(lo);
        task.kv_end = static_cast<int32_t>(hi);
        const int64_t cost = (qe - qb) * group * heads_per_task * (hi - lo) + kTaskOverhead;
        plan.class_used[static_cast<int>(ClassOfRows((qe - qb) * group))] = true;
        whole.push_back(task);
        whole_costs.push_back(cost);
        total_cost += cost;
      }
    }
  }

  // Flash-decoding split: with more than one thread, a task costlier than
  // its share is cut into chunks of whole KV tiles, each writing a partial.
  const int64_t threads = std::max(num_threads, 1);
  const int64_t share = threads > 1
                            ? std::max<int64_t>(total_cost / (threads * kTasksPerThread), 1)
                            : total_cost + 1;
  const int64_t dim_pad = RoundUp(problem.head_dim, kDimAlign);
  for (size_t i = 0; i < whole.size(); ++i) {
    const KernelTask& task = whole[i];
    const int64_t cost = whole_costs[i];
    const int64_t keys = task.kv_end - task.kv_begin;
    const int64_t rows = (task.q_end - task.q_begin) * group * (task.kv_head_end - task.kv_head);
    int64_t chunks = std::max<int64_t>(1, cost / share);
    // Chunk boundaries on KV tile boundaries.
    const int64_t first_tile = task.kv_begin / kv_block;
    const int64_t num_tiles = keys > 0 ? (task.kv_end - 1) / kv_block - first_tile + 1 : 1;
    chunks = std::clamp<int64_t>(chunks, 1, num_tiles);
    const int64_t tiles_per_chunk = CeilDiv(num_tiles, chunks);
    chunks = CeilDiv(num_tiles, tiles_per_chunk);
    if (chunks == 1) {
      plan.tasks.push_back(task);
      plan.costs.push_back(cost);
      continue;
    }
    MergeGroup merge;
    merge.first_task = static_cast<int32_t>(plan.tasks.size());
    merge.num_tasks = static_cast<int32_t>(chunks);
    plan.merges.push_back(merge);
    for (int64_t c = 0; c < chunks; ++c) {
      KernelTask part = task;
      part.kv_begin = static_cast<int32_t>(
          std::max<int64_t>(task.kv_begin, (first_tile + c * tiles_per_chunk) * kv_block));
      part.kv_end = static_cast<int32_t>(
          std::min<int64_t>(task.kv_end, (first_tile + (c + 1) * tiles_per_chunk) * kv_block));
      part.partial_offset = plan.partial_floats;
      plan.partial_floats += PartialFloats(rows, dim_pad);
      plan.tasks.push_back(part);
      plan.costs.push_back(rows * (part.kv_end - part.kv_begin) + kTaskOverhead);
    }
  }

  plan.order.resize(plan.tasks.size());
  std::iota(plan.order.begin(), plan.order.end(), 0);
  // Stable: equal costs keep their natural order, so the plan is the same
  // every time.
  std::stable_sort(plan.order.begin(), plan.order.end(),
                   [&](int32_t a, int32_t b) { return plan.costs[a] > plan.costs[b]; });
  plan.num_workers = static_cast<int>(
      std::min<int64_t>(threads, std::max<int64_t>(static_cast<int64_t>(plan.tasks.size()), 1)));
}

}  // namespace rpa::internal
