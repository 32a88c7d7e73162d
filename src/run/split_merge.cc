// The split-KV merge (split_merge.h): the log-sum-exp merge of a query
// tile's KV chunks, each a task of the plan.
#include "run/split_merge.h"

#include <algorithm>
#include <cstdint>

#include "kernel/softmax_finish.h"
#include "kernel/tile_kernel.h"
#include "rpa/dtype.h"

namespace rpa::internal {

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
  auto part_of = [&](int32_t c) {
    return partials + plan.tasks[group.first_task + c].partial_offset;
  };
  float out_row[4096];
  for (int64_t r = 0; r < rows; ++r) {
    const MergedRow merged = MergeRowState(group.num_tasks, part_of, rows, r);
    const int64_t token = q_start + first.q_begin + (r % rows_per_head) / G;
    const int64_t head = (first.kv_head + r / rows_per_head) * G + r % G;
    const FinishedRow f =
        FinishRow(merged.m, merged.l, p.sinks != nullptr ? p.sinks + head : nullptr, p.v_scale);
    if (p.lse != nullptr) p.lse[token * p.lse_token_stride + head] = f.lse;
    uint8_t* dst = static_cast<uint8_t*>(p.out) +
                   (token * p.out_token_stride + head * p.out_head_stride) * elem;
    for (int64_t d0 = 0; d0 < p.head_dim; d0 += 4096) {
      const int64_t count = std::min<int64_t>(4096, p.head_dim - d0);
      std::fill(out_row, out_row + count, 0.0f);
      for (int32_t c = 0; c < group.num_tasks; ++c) {
        const float* part = part_of(c);
        const float w = MergeWeight(merged, part[r]);
        const float* acc = part + 2 * rows + r * dim_pad + d0;
        for (int64_t d = 0; d < count; ++d) out_row[d] += w * acc[d];
      }
      for (int64_t d = 0; d < count; ++d) {
        StoreFromF32(p.q_dtype, dst, d0 + d, out_row[d] * f.out_scale);
      }
    }
  }
}

}  // namespace rpa::internal
