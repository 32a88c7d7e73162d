// One worker's scratch: its layout, written once, both to size it (the plan
// and the block-size fit under vmem_limit_bytes) and to carve it out of a
// buffer (the run).
#ifndef RPA_SRC_KERNEL_SCRATCH_H_
#define RPA_SRC_KERNEL_SCRATCH_H_

#include <cstddef>
#include <cstdint>

#include "kernel/tile_kernel.h"
#include "rpa/dtype.h"

namespace rpa::internal {

// Rows of a KV tile padded to this many tokens in scratch.
inline constexpr int64_t kTokenAlign = 16;
// A task's rows padded to this many in scratch: the AMX kernel's tiles
// always have 16 rows (its padding rows are read and written, never used).
inline constexpr int64_t kRowAlign = 16;
// Keys of a packed K tile are padded to twice the widest vector.
inline constexpr int64_t kPackedTokenAlign = 32;

// Tiles whose row pointers a walk holds: the current one and the next.
inline constexpr int64_t kTileRowSlots = 2;

struct WorkerScratch {
  int64_t dim_pad = 0;    // RoundUp(head_dim, kDimAlign).
  int64_t token_pad = 0;  // RoundUp(kv_block, kTokenAlign).
  float* q = nullptr;     // [rows, dim_pad] f32, zero padded (QueryFormat::kF32).
  // [rows, QueryStride(format, dim_pad)] each format's rows (kF32: q;
  // kBf16PairLanes: its lane rows, each kv head's in whole blocks), and
  // [rows] the factors that undo their scaling.
  void* q_format[kNumQueryFormats] = {};
  float* q_unscale[kNumQueryFormats] = {};
  float* s = nullptr;    // [rows, token_pad] logits, then weights.
  float* acc = nullptr;  // [rows, dim_pad] output accumulators.
  float* m = nullptr;    // [rows] running max.
  float* l = nullptr;    // [rows] running sum.
  int32_t* needed = nullptr;  // [rows] TileLogits::needed of the current tile.
  // [kTileRowSlots][token_pad] each: kv head task.kv_head's K / V row of
  // each key of the current and the next tile (ping-pong); other heads are
  // a fixed offset.
  const uint8_t** k_base = nullptr;
  const uint8_t** v_base = nullptr;
  // [2 * num_kv_heads * min(token_pad, kMultiHeadTile)] for a task over
  // every kv head: the next tile's K and V rows in address order, dealt out
  // to the passes' prefetches (WalkTiles, next_tile_rows.h).
  const uint8_t** next_rows = nullptr;
  TileScratch tile;
};

// What one worker's scratch is sized by: the plan's tiles and the problem's
// heads, as the plan, the block-size fit and the tests give them. Its rows
// (LayoutScratch): the most of any task, q_tile x group, or for tiles of at
// most kMultiHeadMaxRows rows per kv head (a sequence's last tile may be
// one), which take every kv head in one task, num_kv_heads x theirs.
struct ScratchShape {
  int64_t q_tile = 1;        // Query tokens per tile.
  int64_t kv_block = 1;      // Keys per KV tile.
  int64_t group = 1;         // q heads per kv head.
  int64_t num_kv_heads = 1;
  int64_t head_dim = 1;
  DType kv_dtype = DType::kF32;
};

// Lays one worker's scratch out at base (64-byte aligned sections) into
// *out; base null: only measures. Returns its size in floats.
size_t LayoutScratch(const ScratchShape& shape, float* base, WorkerScratch* out);

inline int64_t ScratchBytes(const ScratchShape& shape) {
  return static_cast<int64_t>(LayoutScratch(shape, nullptr, nullptr) * sizeof(float));
}

}  // namespace rpa::internal

#endif  // RPA_SRC_KERNEL_SCRATCH_H_
