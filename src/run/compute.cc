// The fast path's run: the kernel tasks of a plan on the thread pool, then
// the merges of split tasks. Nothing here allocates once the calling
// thread's workspace has grown to the largest plan it ran.
#include "run/compute.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <vector>

#include "kernel/kernel.h"
#include "plan/plan.h"
#include "run/split_merge.h"
#include "threads/thread_pool.h"

namespace rpa::internal {
namespace {

constexpr size_t kAlign = 64;  // A cache line: workers never share one.

// A 64-byte aligned buffer that only grows.
class ScratchBuffer {
 public:
  float* Get(size_t floats) {
    if (floats > capacity_) {
      data_.reset(static_cast<float*>(::operator new[](floats * sizeof(float),
                                                      std::align_val_t{kAlign})));
      capacity_ = floats;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t{kAlign}); }
  };
  std::unique_ptr<float[], Free> data_;
  size_t capacity_ = 0;
};

struct Workspace {
  std::vector<ScratchBuffer> worker_buffers;
  std::vector<WorkerScratch> scratch;
  ScratchBuffer partials;
};

// Zeros the output rows that belong to no sequence.
void ZeroPaddingRows(const AttentionProblem& p) {
  const int64_t begin = p.num_seqs > 0 ? p.cu_q_lens[0] : p.num_tokens;
  const int64_t end = p.num_seqs > 0 ? p.cu_q_lens[p.num_seqs] : p.num_tokens;
  const int64_t elem = static_cast<int64_t>(SizeOf(p.q_dtype));
  auto zero = [&](int64_t token) {
    for (int64_t h = 0; h < p.num_q_heads; ++h) {
      std::memset(static_cast<uint8_t*>(p.out) +
                      (token * p.out_token_stride + h * p.out_head_stride) * elem,
                  0, static_cast<size_t>(p.head_dim * elem));
      if (p.lse != nullptr) {
        p.lse[token * p.lse_token_stride + h] = -std::numeric_limits<float>::infinity();
      }
    }
  };
  for (int64_t t = 0; t < std::min(begin, p.num_tokens); ++t) zero(t);
  for (int64_t t = std::max<int64_t>(end, 0); t < p.num_tokens; ++t) zero(t);
}

}  // namespace

void RunPlan(const AttentionProblem& problem, const Plan& plan) {
  ZeroPaddingRows(problem);
  if (problem.num_seqs <= 0 || plan.tasks.empty()) return;
  // One workspace per calling thread: concurrent callers (of one plan, too)
  // never share one, and a thread's repeated calls reuse it.
  // (A lambda does not capture a thread_local: the workers must reach this
  // thread's workspace through a plain reference.)
  thread_local Workspace workspace;
  Workspace& ws = workspace;
  const int workers = plan.num_workers;
  if (static_cast<int>(ws.worker_buffers.size()) < workers) ws.worker_buffers.resize(workers);
  ws.scratch.resize(std::max<size_t>(ws.scratch.size(), static_cast<size_t>(workers)));
  const size_t floats = LayoutScratch(plan.scratch, nullptr, nullptr);
  for (int w = 0; w < workers; ++w) {
    LayoutScratch(plan.scratch, ws.worker_buffers[w].Get(floats), &ws.scratch[w]);
  }
  float* partials = plan.partial_floats > 0
                        ? ws.partials.Get(static_cast<size_t>(plan.partial_floats))
                        : nullptr;

  const KernelRun run{&plan.kernels, plan.kv_block};
  ThreadPool& pool = GlobalThreadPool();
  pool.ParallelFor(static_cast<int64_t>(plan.tasks.size()), workers,
                   [&](int64_t i, int worker) {
                     RunKernelTask(problem, plan.tasks[plan.order[i]], run, ws.scratch[worker],
                                   partials);
                   });
  if (!plan.merges.empty()) {
    pool.ParallelFor(static_cast<int64_t>(plan.merges.size()), workers,
                     [&](int64_t i, int /*worker*/) {
                       MergeGroupRows(problem, plan, plan.merges[i], partials);
                     });
  }
}

void ComputeAttention(const AttentionProblem& problem) {
  thread_local Plan plan;
  if (problem.num_seqs > 0) {
    BuildPlan(problem, ResolveNumThreads(problem.num_threads), plan);
  } else {
    plan.tasks.clear();
  }
  RunPlan(problem, plan);
}

std::string DescribeKernels(const AttentionProblem& problem) {
  if (problem.num_seqs <= 0) return "none";
  Plan plan;
  BuildPlan(problem, ResolveNumThreads(problem.num_threads), plan);
  return plan.DescribeKernels();
}

}  // namespace rpa::internal
