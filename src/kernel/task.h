// The kernel's unit of work: one task is (sequence, kv head(s), query tile,
// KV chunk). The plan (plan.h) makes the tasks; the task loop
// (task_loop-inl.h) runs one through the kernels dispatch chose.
#ifndef RPA_SRC_KERNEL_TASK_H_
#define RPA_SRC_KERNEL_TASK_H_

#include <cstdint>

namespace rpa::internal {

// The rows of a task are the query tile's tokens times the q heads that
// share a kv head, row r = (token q_begin + r / G, q head kv_head * G + r %
// G), so each K/V element is loaded from memory once per query tile. The
// task walks its KV chunk in tiles of kv_block keys with a flash-attention
// online softmax.
struct KernelTask {
  int32_t seq = 0;
  // KV heads [kv_head, kv_head_end). Decode-like tiles (few rows per kv head)
  // take every kv head of the sequence in one task, so K/V are read page by
  // page, whole token rows at a time, instead of 512 B out of every 4 KiB.
  // Rows are kv-head major: row r = (kv head kv_head + r / RH, token
  // q_begin + (r % RH) / G, q head (kv head) * G + r % G), RH = q tokens x G.
  int32_t kv_head = 0;
  int32_t kv_head_end = 1;
  int32_t q_begin = 0;  // Query tokens [q_begin, q_end) of the sequence.
  int32_t q_end = 0;
  int32_t kv_begin = 0;  // Keys [kv_begin, kv_end); may be empty.
  int32_t kv_end = 0;
  // -1: the task owns its rows' whole KV range and writes problem.out.
  // Else: it writes a partial (m, l, acc) at this float offset of the plan's
  // partial buffer, merged later by log-sum-exp.
  int64_t partial_offset = -1;
};

// Partial of a split task: [rows] m, [rows] l, [rows, dim_pad] acc (natural
// dimension order, in V's units: the merge needs only v_scale).
inline int64_t PartialFloats(int64_t rows, int64_t dim_pad) { return rows * (2 + dim_pad); }

// Tasks by rows per kv head (query tokens of the tile x q heads per kv head);
// each class has its own row in the dispatch table (dispatch.h).
enum class TaskClass : uint8_t {
  kDecode,   // <= kDecodeMaxRows: fused tiles.
  kMiddle,   // Between: unfused, K/V converted in registers.
  kPrefill,  // >= kPackedMinRows: each K/V tile converted once and reused.
};
inline constexpr int kNumTaskClasses = 3;
inline constexpr int64_t kDecodeMaxRows = 8;
// Query tiles with at most this many rows per kv head (decode, and the
// middle class's speculative verification of up to 4 tokens x 4 q heads)
// are one task over every kv head: K/V are read whole token rows at a time,
// and on CPUs that stream it best the next tile is prefetched in address
// order (task_loop-inl.h, NextTileRows). Verify (16 rows) ran 10-20% faster
// so on Zen 5 than as a task per kv head, 1.3-1.4x on Zen 4 (per-head
// prefetch; docs/kernel_log.md).
inline constexpr int64_t kMultiHeadMaxRows = 16;
inline constexpr int64_t kPackedMinRows = 32;

// Keys per tile when a task spans several kv heads (32 tokens x 4 KiB for 8
// kv heads x 128 bf16 x K,V = 128 KiB per tile). Measured on the decode
// shape (docs/kernel.md): 24-32 keys 9.4 ms, 48 9.7, 64 13.6, 128 22 (no
// prefetch): the next tile, prefetched meanwhile, and the current one stay
// in L2 and the misses in flight stay few enough not to stall the products.
inline constexpr int64_t kMultiHeadTile = 32;

inline TaskClass ClassOfRows(int64_t rows_per_kv_head) {
  return rows_per_kv_head <= kDecodeMaxRows   ? TaskClass::kDecode
         : rows_per_kv_head < kPackedMinRows ? TaskClass::kMiddle
                                              : TaskClass::kPrefill;
}
const char* ToString(TaskClass c);

}  // namespace rpa::internal

#endif  // RPA_SRC_KERNEL_TASK_H_
