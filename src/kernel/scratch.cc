#include "kernel/scratch.h"

#include <algorithm>

#include "kernel/task.h"

namespace rpa::internal {

namespace {

int64_t ScratchRows(int64_t q_tile, int64_t group, int64_t num_kv_heads) {
  // A sequence's last query tile may be short enough to take every kv head.
  // Head h's rows then start at h x its rows, and the AMX kernel's 16-row
  // tiles of the last head reach its rows rounded up to kRowAlign.
  const int64_t rows = q_tile * group;
  const int64_t per_head = std::min(rows, kMultiHeadMaxRows);
  return RoundUp(std::max(rows, (num_kv_heads - 1) * per_head + RoundUp(per_head, kRowAlign)),
                 kRowAlign);
}

// Lane rows of kBf16PairLanes (tile_kernel.h), each kv head's rows in whole
// blocks of kQueryLanes, for the middle class's tasks only (the one class
// whose kernel takes them): a tile of k <= q_tile tokens has k x group rows
// per kv head, and one of at most kMultiHeadMaxRows takes every kv head.
int64_t ScratchLaneRows(int64_t q_tile, int64_t group, int64_t num_kv_heads) {
  int64_t lane_rows = 0;
  for (int64_t tokens = 1; tokens <= q_tile && tokens * group < kPackedMinRows; ++tokens) {
    const int64_t per_head = tokens * group;
    if (ClassOfRows(per_head) != TaskClass::kMiddle) continue;
    const int64_t heads = per_head <= kMultiHeadMaxRows ? num_kv_heads : 1;
    lane_rows = std::max(lane_rows, heads * LaneRowsPerHead(per_head));
  }
  return lane_rows;
}

}  // namespace

size_t LayoutScratch(const ScratchShape& shape, float* base, WorkerScratch* out) {
  const int64_t rows = ScratchRows(shape.q_tile, shape.group, shape.num_kv_heads);
  const int64_t dim_pad = RoundUp(shape.head_dim, kDimAlign);
  const int64_t token_pad = RoundUp(shape.kv_block, kTokenAlign);
  size_t offset = 0;
  auto take = [&](int64_t floats) {
    float* p = base == nullptr ? nullptr : base + offset;
    offset += static_cast<size_t>(RoundUp(floats, 16));  // A cache line: workers never share one.
    return p;
  };
  constexpr int64_t kPointerFloats = sizeof(void*) / sizeof(float);
  WorkerScratch s;
  s.dim_pad = dim_pad;
  s.token_pad = token_pad;
  s.q = take(rows * dim_pad);
  const int64_t lane_rows = ScratchLaneRows(shape.q_tile, shape.group, shape.num_kv_heads);
  for (int f = 0; f < kNumQueryFormats; ++f) {
    const auto format = static_cast<QueryFormat>(f);
    const int64_t format_rows = format == QueryFormat::kBf16PairLanes ? lane_rows : rows;
    s.q_format[f] = format == QueryFormat::kF32
                        ? s.q
                        : take(format_rows * QueryStride(format, dim_pad) *
                               QueryElemBytes(format) / 4);
    s.q_unscale[f] = take(rows);
  }
  s.s = take(rows * token_pad);
  s.acc = take(rows * dim_pad);
  s.m = take(rows);
  s.l = take(rows);
  s.needed = reinterpret_cast<int32_t*>(take(rows));
  s.k_base = reinterpret_cast<const uint8_t**>(take(kTileRowSlots * token_pad * kPointerFloats));
  s.v_base = reinterpret_cast<const uint8_t**>(take(kTileRowSlots * token_pad * kPointerFloats));
  s.next_rows = reinterpret_cast<const uint8_t**>(
      take(2 * shape.num_kv_heads * std::min(token_pad, kMultiHeadTile) * kPointerFloats));
  s.tile.dim_pad = dim_pad;
  s.tile.packed = take(RoundUp(shape.kv_block, kPackedTokenAlign) * dim_pad);
  s.tile.row_pointers = reinterpret_cast<const void**>(take(token_pad * kPointerFloats));
  s.tile.tail_rows = take(kRowAlign * dim_pad);
  s.tile.logits = take(kRowChunk * RoundUp(shape.kv_block, kPackedTokenAlign));
  if (SizeOf(shape.kv_dtype) == 1) {
    s.tile.kv_bf16 = reinterpret_cast<uint16_t*>(take(token_pad * dim_pad / 2));
    s.tile.converted = reinterpret_cast<const uint8_t**>(take(token_pad * kPointerFloats));
  }
  if (out != nullptr) *out = s;
  return offset;
}

}  // namespace rpa::internal
