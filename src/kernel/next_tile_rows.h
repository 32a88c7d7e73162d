// Which rows of the next KV tile a task's passes prefetch (WalkTiles,
// task_loop-inl.h): plain pointer bookkeeping, compiled once, tested alone.
#ifndef RPA_SRC_KERNEL_NEXT_TILE_ROWS_H_
#define RPA_SRC_KERNEL_NEXT_TILE_ROWS_H_

#include <cstdint>

#include "kernel/tile_kernel.h"
#include "problem.h"

namespace rpa::internal {

// Where a task over several kv heads prefetches the next tile's rows: in
// address order where the CPU streams them best that way
// (CpuFeatures::prefetch_in_address_order: Zen 5) and a token's rows of every
// kv head lie together (the combined cache, and NHD caches); one kv head's
// rows at a time otherwise (other CPUs; HND, heads outermost in a page).
//
// A pass (one kv head's K, or its V) prefetches `count` rows of its list as
// it reads its own. Dealing out the next tile's rows of every head in
// address order (token by token: K then V of head 0, 1, ...) instead of each
// pass prefetching its own head's rows, a token (4 KiB) apart, makes the
// requests a sequential stream: 27-28 GB/s against 16-18 on one Zen 5 core
// for the same rows and the same number of prefetches (docs/kernel_log.md).
// On Zen 4 the same order made decode 1.6x slower, on Intel Sapphire Rapids
// 1.25-1.33x.
struct NextTileRows {
  const uint8_t** rows = nullptr;  // [2 * heads * n]: token-major, then K, V of each head.
  int64_t n = 0;                   // Keys of the next tile.
  bool address_order = false;

  PrefetchTo PrefetchLevel() const { return address_order ? PrefetchTo::kL1 : PrefetchTo::kL2; }

  // The next tile's K (kv = 0) or V (kv = 1) pass of kv head h: its rows to prefetch.
  KvRows ForPass(const uint8_t* const* own_base, int64_t own_offset, int64_t h, int kv) const {
    if (!address_order) return {own_base, own_offset, n};
    return {rows + (2 * h + kv) * n, 0, n, PrefetchLevel()};
  }
};

// Whether a token's K and V rows of every kv head lie together: heads
// inside a page slot (the combined cache, NHD), not slots inside a head (HND).
inline bool TokenRowsTogether(const PagesView& k, const PagesView& v) {
  return k.head_stride < k.slot_stride && v.head_stride < v.slot_stride;
}

// The next tile's rows of every kv head, token by token (NextTileRows).
inline void ListRowsInAddressOrder(const uint8_t* const* k_base, const uint8_t* const* v_base,
                                   int64_t n, int64_t heads, int64_t k_head_bytes,
                                   int64_t v_head_bytes, const uint8_t** rows) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      *rows++ = k_base[i] + h * k_head_bytes;
      *rows++ = v_base[i] + h * v_head_bytes;
    }
  }
}

}  // namespace rpa::internal

#endif  // RPA_SRC_KERNEL_NEXT_TILE_ROWS_H_
