// The fast path: plan, then run the kernel tasks on the thread pool, then
// merge split tasks. Nothing here allocates once the per-thread workspace
// has grown to the largest problem seen.
#include "compute.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <vector>

#include "kernel/kernel.h"
#include "plan.h"
#include "thread_pool.h"

namespace rpa::internal {
namespace {

std::atomic<bool> g_allow_bf16_dot{true};
std::atomic<bool> g_allow_half_decode{true};
std::atomic<bool> g_prefer_bf16_dot{false};

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
  Plan plan;
  std::vector<ScratchBuffer> worker_buffers;
  std::vector<WorkerScratch> scratch;
  ScratchBuffer partials;
};

// Carves one worker's scratch out of its buffer (sections 64-byte aligned).
size_t LayoutScratch(const Plan& plan, const AttentionProblem& problem, float* base,
                     WorkerScratch* ws) {
  const int64_t rows = plan.max_rows;
  const int64_t dim_pad = RoundUp(problem.head_dim, kDimAlign);
  const int64_t token_pad = RoundUp(plan.kv_block, kTokenAlign);
  size_t offset = 0;
  auto take = [&](int64_t floats) {
    float* p = base == nullptr ? nullptr : base + offset;
    offset += static_cast<size_t>(RoundUp(floats, 16));
    return p;
  };
  WorkerScratch s;
  s.dim_pad = dim_pad;
  s.token_pad = token_pad;
  s.q = take(rows * dim_pad);
  s.q_hi = reinterpret_cast<uint16_t*>(take(rows * dim_pad / 2 + 1));
  s.q_lo = reinterpret_cast<uint16_t*>(take(rows * dim_pad / 2 + 1));
  s.q_eo = take(rows * dim_pad);
  s.q_half = reinterpret_cast<uint16_t*>(take(rows * RoundUp(dim_pad, kHalfDimAlign) / 2));
  s.q_half_unscale = take(rows);
  s.s = take(rows * token_pad);
  s.acc = take(rows * dim_pad);
  s.m = take(rows);
  s.l = take(rows);
  s.k_rows = reinterpret_cast<const void**>(take(token_pad * 2));
  s.v_rows = reinterpret_cast<const void**>(take(token_pad * 2));
  s.kv_bf16 = SizeOf(problem.kv_dtype) == 1
                  ? reinterpret_cast<uint16_t*>(take(token_pad * dim_pad / 2))
                  : nullptr;
  s.packed = take(RoundUp(plan.kv_block, kPackedTokenAlign) * dim_pad);
  s.k_next = reinterpret_cast<const void**>(take(token_pad * 2));
  s.v_next = reinterpret_cast<const void**>(take(token_pad * 2));
  s.k_base = reinterpret_cast<const uint8_t**>(take(token_pad * 4));
  s.v_base = reinterpret_cast<const uint8_t**>(take(token_pad * 4));
  if (ws != nullptr) *ws = s;
  return offset;
}

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

// out = sum_c w_c acc_c * v_scale / sum_c w_c l_c with w_c = exp(m_c - max m):
// the log-sum-exp merge of a query tile's KV chunks, in chunk order.
void MergeGroupRows(const AttentionProblem& p, const Plan& plan, const MergeGroup& group,
                    const float* partials) {
  const KernelTask& first = plan.tasks[group.first_task];
  const int64_t G = p.QueriesPerKvHead();
  const int64_t rows_per_head = (first.q_end - first.q_begin) * G;
  const int64_t rows = rows_per_head * (first.kv_head_end - first.kv_head);
  const int64_t dim_pad = RoundUp(p.head_dim, kDimAlign);
  const int64_t q_start = p.cu_q_lens[first.seq];
  const int64_t elem = static_cast<int64_t>(SizeOf(p.q_dtype));
  float out_row[4096];
  for (int64_t r = 0; r < rows; ++r) {
    // A poisoned chunk (m NaN: a NaN or +inf logit) makes the row NaN.
    float m = -std::numeric_limits<float>::infinity();
    for (int32_t c = 0; c < group.num_tasks; ++c) {
      const float mc = partials[plan.tasks[group.first_task + c].partial_offset + r];
      m = std::isnan(mc) || std::isnan(m) ? std::numeric_limits<float>::quiet_NaN()
                                          : std::max(m, mc);
    }
    // Every chunk without a finite logit and one with l == -0 (keys whose
    // logits are all -inf, SoftmaxRow): NaN, as in the kernel.
    bool nan_row = false;
    if (m == -std::numeric_limits<float>::infinity()) {
      for (int32_t c = 0; c < group.num_tasks; ++c) {
        const float lc = partials[plan.tasks[group.first_task + c].partial_offset + rows + r];
        nan_row = nan_row || (lc == 0.0f && std::signbit(lc));
      }
    }
    float l = 0.0f;
    for (int64_t d0 = 0; d0 < p.head_dim; d0 += 4096) {
      const int64_t count = std::min<int64_t>(4096, p.head_dim - d0);
      std::fill(out_row, out_row + count, 0.0f);
      l = 0.0f;
      for (int32_t c = 0; c < group.num_tasks; ++c) {
        const float* part = partials + plan.tasks[group.first_task + c].partial_offset;
        // A chunk whose logits were all -inf has weight 0 (also when every
        // chunk's were), but its acc is NaN where a V element is infinite
        // (0 * inf), as in the reference.
        const float w = m == -std::numeric_limits<float>::infinity() ? 0.0f
                                                                     : std::exp(part[r] - m);
        l += w * part[rows + r];
        const float* acc = part + 2 * rows + r * dim_pad + d0;
        for (int64_t d = 0; d < count; ++d) out_row[d] += w * acc[d];
      }
      const int64_t token = q_start + first.q_begin + (r % rows_per_head) / G;
      const int64_t head = (first.kv_head + r / rows_per_head) * G + r % G;
      // l == 0: no key visible; NaN propagates.
      const float denominator =
          p.sinks != nullptr && l != 0.0f ? l + std::exp(p.sinks[head] - m) : l;
      // e4m3fn V was accumulated as value * 2^-8 (the kernel's LoadF32).
      const float v_scale = p.kv_dtype == DType::kF8E4M3FN ? p.v_scale * 256.0f : p.v_scale;
      if (p.sinks != nullptr && p.sinks[head] != -std::numeric_limits<float>::infinity()) {
        nan_row = false;  // A finite sink bounds the reference's shift: output 0.
      }
      const float scale = nan_row     ? std::numeric_limits<float>::quiet_NaN()
                          : l != 0.0f ? v_scale / denominator
                                      : 0.0f;
      if (p.lse != nullptr && d0 == 0) {
        p.lse[token * p.lse_token_stride + head] =
            nan_row     ? std::numeric_limits<float>::quiet_NaN()
            : l != 0.0f ? m + std::log(l)
                        : -std::numeric_limits<float>::infinity();
      }
      uint8_t* dst = static_cast<uint8_t*>(p.out) +
                     (token * p.out_token_stride + head * p.out_head_stride) * elem;
      for (int64_t d = 0; d < count; ++d) StoreFromF32(p.q_dtype, dst, d0 + d, out_row[d] * scale);
    }
  }
}

}  // namespace

void AllowBf16DotPath(bool allow) { g_allow_bf16_dot.store(allow); }
void AllowHalfDecode(bool allow) { g_allow_half_decode.store(allow); }
bool HalfDecodeEnabled() { return g_allow_half_decode.load() && CpuHasAvx512Fp16(); }
void PreferBf16Dot(bool prefer) { g_prefer_bf16_dot.store(prefer); }

KernelPath ChooseKernelPath(const AttentionProblem& problem) {
  const bool bf16_exact = problem.kv_dtype == DType::kBF16 ||
                          problem.kv_dtype == DType::kF8E4M3FN ||
                          problem.kv_dtype == DType::kF8E5M2;
  if (!bf16_exact || !g_allow_bf16_dot.load()) return KernelPath::kHighway;
  if (CpuHasAvx512Bf16() && (g_prefer_bf16_dot.load() || !CpuHasAvx512Bw())) {
    return KernelPath::kAvx512Bf16;
  }
  return CpuHasAvx512Bw() ? KernelPath::kAvx512Wide : KernelPath::kHighway;
}

void ComputeAttention(const AttentionProblem& problem) {
  ZeroPaddingRows(problem);
  if (problem.num_seqs <= 0) return;
  // One workspace per calling thread: concurrent callers never share one,
  // and a thread's repeated calls reuse it.
  // (A lambda does not capture a thread_local: the workers must reach this
  // thread's workspace through a plain reference.)
  thread_local Workspace workspace;
  Workspace& ws = workspace;
  const int threads = ResolveNumThreads(problem.num_threads);
  Plan& plan = ws.plan;
  BuildPlan(problem, threads, plan);
  if (plan.tasks.empty()) return;
  const KernelPath path = ChooseKernelPath(problem);

  const int workers = plan.num_workers;
  if (static_cast<int>(ws.worker_buffers.size()) < workers) ws.worker_buffers.resize(workers);
  ws.scratch.resize(std::max<size_t>(ws.scratch.size(), static_cast<size_t>(workers)));
  const size_t floats = LayoutScratch(plan, problem, nullptr, nullptr);
  for (int w = 0; w < workers; ++w) {
    LayoutScratch(plan, problem, ws.worker_buffers[w].Get(floats), &ws.scratch[w]);
  }
  float* partials = plan.partial_floats > 0
                        ? ws.partials.Get(static_cast<size_t>(plan.partial_floats))
                        : nullptr;

  ThreadPool& pool = GlobalThreadPool();
  pool.ParallelFor(static_cast<int64_t>(plan.tasks.size()), workers,
                   [&](int64_t i, int worker) {
                     RunKernelTask(problem, plan.tasks[plan.order[i]], plan.kv_block, path,
                                   ws.scratch[worker], partials);
                   });
  if (!plan.merges.empty()) {
    pool.ParallelFor(static_cast<int64_t>(plan.merges.size()), workers,
                     [&](int64_t i, int /*worker*/) {
                       MergeGroupRows(problem, plan, plan.merges[i], partials);
                     });
  }
}

}  // namespace rpa::internal
