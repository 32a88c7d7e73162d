// RunMlaTasks (mla_plan.h): the tasks on the thread pool, then the merges of
// split tasks. Nothing here allocates once the calling thread's workspace
// has grown to the largest plan it ran.
#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "kernel/softmax_finish.h"
#include "mla/mla_plan.h"
#include "threads/thread_pool.h"

namespace rpa::internal {
namespace {

// A 64-byte aligned buffer that only grows.
class AlignedBuffer {
 public:
  void* Get(size_t bytes) {
    if (bytes > capacity_) {
      data_.reset(static_cast<uint8_t*>(::operator new[](bytes, std::align_val_t{64})));
      capacity_ = bytes;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<uint8_t[], Free> data_;
  size_t capacity_ = 0;
};

struct MlaWorkspace {
  std::vector<AlignedBuffer> buffers;  // One per worker.
  std::vector<MlaScratch> scratch;
  AlignedBuffer partials;
};

// out = sum_c w_c acc_c * unit / sum_c w_c l_c, w_c = e^(m_c - max m): the
// log-sum-exp merge of one query tile's KV chunks, in chunk order.
void MergeRows(const MlaProblem& p, const MlaTasks& t, const MlaMerge& merge,
               const float* partials) {
  const MlaTask& first = t.tasks[merge.first_task];
  const int64_t rows = (first.q_end - first.q_begin) * p.num_heads;
  const int64_t q_start = p.cu_q_lens[first.seq];
  const int64_t elem = static_cast<int64_t>(SizeOf(p.q_dtype));
  const float unit = MlaValueUnit(p, *t.kernel);
  auto part_of = [&](int32_t c) { return partials + t.tasks[merge.first_task + c].partial_offset; };
  float row[1024];
  for (int64_t r = 0; r < rows; ++r) {
    const MergedRow merged = MergeRowState(merge.num_tasks, part_of, rows, r);
    const FinishedRow f = FinishRow(merged.m, merged.l, nullptr, unit);
    const int64_t token = q_start + first.q_begin + r / p.num_heads;
    const int64_t head = r % p.num_heads;
    if (p.lse != nullptr) p.lse[token * p.lse_stride + head] = f.lse;
    std::fill(row, row + p.dim_ckv, 0.0f);
    for (int32_t c = 0; c < merge.num_tasks; ++c) {
      const float* part = part_of(c);
      const float w = MergeWeight(merged, part[r]);
      const float* acc = part + 2 * rows + r * p.dim_ckv;
      for (int64_t d = 0; d < p.dim_ckv; ++d) row[d] += w * acc[d];
    }
    uint8_t* dst = static_cast<uint8_t*>(p.out) +
                   (token * p.out_token_stride + head * p.out_head_stride) * elem;
    for (int64_t d = 0; d < p.dim_ckv; ++d) StoreFromF32(p.q_dtype, dst, d, row[d] * f.out_scale);
  }
}

}  // namespace

void RunMlaTasks(const MlaProblem& problem, const MlaTasks& t) {
  if (t.tasks.empty()) return;
  // One workspace per calling thread: concurrent callers never share one.
  thread_local MlaWorkspace workspace;
  MlaWorkspace& ws = workspace;
  const int workers = t.num_workers;
  if (static_cast<int>(ws.buffers.size()) < workers) ws.buffers.resize(workers);
  if (static_cast<int>(ws.scratch.size()) < workers) ws.scratch.resize(workers);
  const size_t bytes = LayoutMlaScratch(t.scratch, nullptr, nullptr);
  for (int w = 0; w < workers; ++w) {
    LayoutMlaScratch(t.scratch, ws.buffers[w].Get(bytes), &ws.scratch[w]);
  }
  float* partials =
      t.partial_floats > 0
          ? static_cast<float*>(ws.partials.Get(static_cast<size_t>(t.partial_floats) * 4))
          : nullptr;
  ThreadPool& pool = GlobalThreadPool();
  pool.ParallelFor(static_cast<int64_t>(t.tasks.size()), workers, [&](int64_t i, int worker) {
    RunMlaTask(problem, t.tasks[t.order[i]], *t.kernel, ws.scratch[worker], partials);
  });
  if (!t.merges.empty()) {
    pool.ParallelFor(static_cast<int64_t>(t.merges.size()), workers,
                     [&](int64_t i, int /*worker*/) {
                       MergeRows(problem, t, t.merges[i], partials);
                     });
  }
}

}  // namespace rpa::internal
