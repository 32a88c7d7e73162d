// What a tile kernel is: the arguments every tile function takes (named
// structs, shapes in brackets) and the table rows dispatch chooses from.
//
// A task's rows over one KV tile of n keys run the flash-attention step
//   S = Q K^T                         (ProductKernel::logits)
//   online softmax of S -> P, m, l    (the task loop, softmax-inl.h)
//   acc = alpha acc + P V             (ProductKernel::pv)
// or, for a group of rows whose keys are all visible (up to 4 decode rows,
// up to 16 of the middle class), one fused tile that keeps S and P in
// registers (FusedTileKernel::tile). dispatch.h says
// which kernels a call runs; each kernel's file says what it computes.
#ifndef RPA_SRC_KERNEL_TILE_KERNEL_H_
#define RPA_SRC_KERNEL_TILE_KERNEL_H_

#include <algorithm>
#include <cstdint>

#include "rpa/dtype.h"

namespace rpa::internal {

inline int64_t RoundUp(int64_t x, int64_t align) { return (x + align - 1) / align * align; }

// head_dim padded to this in scratch: the widest vector (16 f32 / 32 bf16)
// never needs a tail there.
inline constexpr int64_t kDimAlign = 32;
// The f16 query rows of the 8-bit decode tiles are padded further.
inline constexpr int64_t kHalfDimAlign = 64;

// How a kernel wants its query rows stored (QueryRows::data).
enum class QueryFormat : uint8_t {
  kF32,         // [rows, dim_pad] f32, zero padded.
  kF32EvenOdd,  // [rows, dim_pad] f32, each 32 dims even then odd (WideQIndex).
  kHalf,        // [rows, RoundUp(dim_pad, 64)] f16 scaled by a power of 2 (QRowToHalf).
  kBf16,        // [rows, dim_pad] bf16 (round to nearest even), zero padded.
  // kBf16's rows transposed, 16 rows to a block, each pair of dims (2j,
  // 2j + 1) one uint32: [blocks][dim_pad / 2][16] (QueryLaneIndex), each kv
  // head's rows starting a block (LaneRowsPerHead), lanes past them zero.
  kBf16PairLanes,
};
inline constexpr int kNumQueryFormats = 5;

// Rows to a kBf16PairLanes block: one per f32 lane of a 512-bit vector.
inline constexpr int64_t kQueryLanes = 16;

// Lane rows a kv head's rows take in kBf16PairLanes: whole blocks.
inline int64_t LaneRowsPerHead(int64_t rows_per_head) {
  return (rows_per_head + kQueryLanes - 1) / kQueryLanes * kQueryLanes;
}

// Where pair j of lane row L (kv head h's row i is lane row h x
// LaneRowsPerHead + i) lives in kBf16PairLanes, in uint32 elements.
inline int64_t QueryLaneIndex(int64_t lane_row, int64_t pair, int64_t dim_pad) {
  return (lane_row / kQueryLanes * (dim_pad / 2) + pair) * kQueryLanes + lane_row % kQueryLanes;
}

// Elements of the format between query rows.
inline int64_t QueryStride(QueryFormat format, int64_t dim_pad) {
  return format == QueryFormat::kHalf ? RoundUp(dim_pad, kHalfDimAlign) : dim_pad;
}

// Bytes of one element of the format.
inline int64_t QueryElemBytes(QueryFormat format) {
  return format == QueryFormat::kF32 || format == QueryFormat::kF32EvenOdd ? 4 : 2;
}

// Where dimension d lives in a kF32EvenOdd row (and a kEvenOdd accumulator):
// within each 32-dimension chunk, the even dimensions first, then the odd.
constexpr int64_t WideQIndex(int64_t d) {
  const int64_t i = d & 31;
  return (d & ~int64_t{31}) + (i & 1) * 16 + (i >> 1);
}

// Where dimension d lives in a kPairInterleaved accumulator row: within
// each 32-dimension chunk, dims 8L + 0..3 of each 128-bit lane L first (the
// low halves of vpunpcklwd's pairs), then dims 8L + 4..7.
constexpr int64_t PairAccIndex(int64_t d) {
  const int64_t i = d & 31;
  return (d & ~int64_t{31}) + ((i >> 2) & 1) * 16 + (i >> 3) * 4 + (i & 3);
}

// The order of the dimensions in the kernel's accumulator rows.
enum class AccOrder : uint8_t { kNatural, kEvenOdd, kPairInterleaved };

// Where dimension d lives in an accumulator row of this order.
constexpr int64_t AccIndex(AccOrder order, int64_t d) {
  switch (order) {
    case AccOrder::kNatural: return d;
    case AccOrder::kEvenOdd: return WideQIndex(d);
    case AccOrder::kPairInterleaved: return PairAccIndex(d);
  }
  return d;
}

// Query rows of one kv head for a tile kernel.
struct QueryRows {
  // [rows, stride] in the kernel's QueryFormat (kBf16PairLanes: from the
  // kv head's first block, stride dim_pad).
  const void* data = nullptr;
  int64_t stride = 0;              // Elements between rows.
  int64_t rows = 0;
  const float* unscale = nullptr;  // [rows] kHalf: the factor undoing the row's scale.
};

// Which cache a prefetch fills. L2 by default: a tile's rows of one kv
// head, a token apart, are needed a whole tile later. L1 for a stream in
// address order (a task over every kv head, WalkTiles): 5-10% faster decode
// on Zen 5, where L1 slowed the middle class and mixed steps by about as
// much when it was used for every prefetch (docs/kernel_log.md).
// kWrite: lines about to be written (an output row), fetched for ownership
// so the stores do not wait for them; x86-64 only where the CPU has PRFCHW
// (kOutputPrefetch, task_loop-inl.h).
enum class PrefetchTo : uint8_t { kL2, kL1, kWrite };

// Whether a kernel's tile step prefetches the whole next tile's rows up front
// (kUpFront) or leaves them to the hardware and its own prefetches a few rows
// ahead (kNone). The AMX kernels do not: on the AMX Xeon the burst (a whole
// tile's rows at once) stalled the step behind it; without it the AMX middle
// class ran 12-14% faster, prefill 7-11%, MLA's 16-head decode 4-8%
// (docs/kernel_log.md, 2026-12-06 second AMX session). The others keep it
// (tuned on Zen 4/5, not measured without it there).
enum class NextTilePrefetch : uint8_t { kUpFront, kNone };

// One kv head's K or V rows of a tile: row i is base[i] + offset bytes, so
// one pointer table (of the task's first kv head) serves every kv head.
struct KvRows {
  const uint8_t* const* base = nullptr;  // [count]
  int64_t offset = 0;
  int64_t count = 0;
  PrefetchTo prefetch_to = PrefetchTo::kL2;  // Where a prefetch of these rows puts them.
  const void* operator[](int64_t i) const { return base[i] + offset; }
};

// Prefetches the cache lines of the `bytes` bytes at p.
//
// On x86-64 as volatile assembly, not __builtin_prefetch: GCC 12 at -O2
// (-ffinite-loops) counts a prefetch as no side effect and deletes a loop
// nest whose only effect is prefetching (PrefetchRows below vanished from
// every logits loop: decode from memory ran 1.8x slower, docs/kernel_log.md).
inline void PrefetchRow(const void* p, int64_t bytes, PrefetchTo to = PrefetchTo::kL2) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const uintptr_t last = (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes) - 1) &
                         ~uintptr_t{63};
  for (uintptr_t line = first; line <= last; line += 64) {
#if defined(__x86_64__)
    if (to == PrefetchTo::kL1) {
      __asm__ volatile("prefetcht0 %0" : : "m"(*reinterpret_cast<const char*>(line)));
    } else if (to == PrefetchTo::kWrite) {
      __asm__ volatile("prefetchw %0" : : "m"(*reinterpret_cast<const char*>(line)));
    } else {
      __asm__ volatile("prefetcht1 %0" : : "m"(*reinterpret_cast<const char*>(line)));
    }
#else
    if (to == PrefetchTo::kWrite) {
      __builtin_prefetch(reinterpret_cast<const void*>(line), 1, 3);
    } else if (to == PrefetchTo::kL1) {
      __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 3);
    } else {
      __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 2);
    }
#endif
  }
}

// Prefetches rows [t, t + n) of `rows` that exist (t < rows.count).
inline void PrefetchRows(const KvRows& rows, int64_t t, int64_t n, int64_t bytes) {
  for (int64_t i = t; i < t + n && i < rows.count; ++i) PrefetchRow(rows[i], bytes, rows.prefetch_to);
}

// A KV tile of n keys in the cache's dtype (the one the kernel running it
// was specialised for: a tile carries no dtype), and the rows of the next
// tile the kernel prefetches while it computes this one (next_tile_rows.h
// says which; KvRows::prefetch_to, into which cache).
struct KvTile {
  int64_t head_dim = 0;
  int64_t row_bytes = 0;  // head_dim * SizeOf(K/V dtype): nothing past a row is read.
  int64_t n = 0;
  KvRows k, v;            // count n.
  KvRows k_next, v_next;  // count 0: nothing to prefetch.
};

// tile with nothing to prefetch (an earlier pass over it prefetched the next).
inline KvTile WithoutNextRows(const KvTile& tile) {
  KvTile without = tile;
  without.k_next.count = without.v_next.count = 0;
  return without;
}

// Logits, then weights, of a block of rows: [rows, stride] f32, keys
// [0, n) valid, the rest up to RoundUp(n, lanes) written as the kernel likes.
struct TileLogits {
  float* s = nullptr;
  int64_t stride = 0;
  int64_t rows = 0;
  // [rows] or null (every row needs every key): row r needs keys [0,
  // needed[r]) only; the others are masked for it and may be skipped
  // (docs/contract.md §1: a vanishing mask), so its logits there need not be
  // written, and its weights there are 0.
  const int32_t* needed = nullptr;
  // s holds the rows' softmax weights already, bf16 in pv's layout
  // (ProductKernel::weights wrote them), not logits.
  bool bf16_weights = false;
};

// The keys rows [r, r + rows) of s need: n, or with TileLogits::needed the
// most any of them needs (the masked keys after the last are skipped).
inline int64_t KeysNeeded(const TileLogits& s, int64_t r, int64_t rows, int64_t n) {
  if (s.needed == nullptr) return n;
  int64_t keys = 0;
  for (int64_t i = r; i < r + rows; ++i) keys = std::max<int64_t>(keys, s.needed[i]);
  return keys;
}

// The online-softmax state of a block of rows.
struct SoftmaxState {
  float* m = nullptr;    // [rows] running maximum.
  float* l = nullptr;    // [rows] running sum of weights.
  float* acc = nullptr;  // [rows, stride] f32, in the kernel's AccOrder.
  int64_t stride = 0;
};

// Per-worker buffers of the products (sized by the plan, scratch.h).
struct TileScratch {
  int64_t dim_pad = 0;          // RoundUp(head_dim, kDimAlign): the stride of both.
  // [RoundUp(kv_block, 32), dim_pad] f32: a packed K or V tile, or bf16 K
  // and V side by side (the bf16-pair kernels' prepare_tile, bf16_pairs.h).
  float* packed = nullptr;
  uint16_t* kv_bf16 = nullptr;  // [token_pad, dim_pad] 8-bit K/V rows as bf16 (else null).
  const uint8_t** converted = nullptr;  // [token_pad] pointers to kv_bf16's rows.
  const void** row_pointers = nullptr;  // [token_pad] a tile's K or V rows as pointers.
  // [16, dim_pad] f32: a partial 16-row AMX tile's accumulator rows padded
  // with zero rows (amx_prefill's pv).
  float* tail_rows = nullptr;
  // [kRowChunk, RoundUp(kv_block, 32)] f32: a row chunk's logits where a
  // kernel's fused softmax reads them back from memory (amx_prefill's weights).
  float* logits = nullptr;
};

// Stores f32 query row q [dim_pad] in a kernel's format at out; returns the
// factor that undoes any scaling (1 if none).
using PrepareQueryRow = float (*)(const float* q, int64_t head_dim, int64_t dim_pad, void* out);

// q row -> kBf16 (round to nearest even; exact for bf16 q, the only q
// dispatch gives the bf16 kernels).
inline float PrepareBf16Row(const float* q, int64_t /*head_dim*/, int64_t dim_pad, void* out) {
  uint16_t* dst = static_cast<uint16_t*>(out);
  for (int64_t d = 0; d < dim_pad; ++d) dst[d] = BF16FromF32(q[d]).bits;
  return 1.0f;
}

// Rows per chunk of a kernel with prepare_tile (a multiple of 16: the bf16
// weights' row blocks).
inline constexpr int64_t kRowChunk = 32;

// The unfused products of one kernel, specialised for one K/V dtype (every
// dtype's instance of a kernel has the same name and fields but the
// functions). A kernel whose e4m3_scaled is set
// reads e4m3fn values as value * 2^-8 (kE4M3Rescale), which the task loop
// undoes in the logit and output scales.
struct ProductKernel {
  const char* name;
  QueryFormat q_format;
  PrepareQueryRow prepare_q;  // Null for kF32.
  AccOrder acc_order;
  bool e4m3_scaled;
  // Null, or the tile's work that its logits and pv share (packs), done
  // once per tile and kv head before them; the task loop then gives them a
  // tile's rows in chunks of kRowChunk, so a chunk's logits stay in L2
  // between the products and the softmax.
  void (*prepare_tile)(const KvTile& tile, const TileScratch& scratch);
  // s[r][i] = q_r . k_i for r < q.rows, i < tile.n.
  void (*logits)(const QueryRows& q, const KvTile& tile, const TileLogits& s,
                 const TileScratch& scratch);
  // acc_r += sum_i p[r][i] v_i for r < p.rows (weights 0 at keys >= n).
  void (*pv)(const TileLogits& p, const KvTile& tile, const SoftmaxState& state,
             const TileScratch& scratch);
  // Null, or the softmax fused into the logits: the weights of rows [0,
  // q.rows) (at most kRowChunk) straight from the products into s, bf16 in
  // pv's layout (TileLogits::bf16_weights), and the rows' m and l updated,
  // their accumulators rescaled. Only for tiles whose rows mask no key but
  // those after their last (TileLogits::needed) and need no soft cap, ALiBi
  // or custom mask: RunHeadTile checks. Returns false, with no state
  // touched, where the reference's special cases arise (a NaN or +inf
  // logit, a row whose keys so far are all -inf): logits, softmax and pv
  // then take the rows.
  bool (*weights)(const QueryRows& q, const KvTile& tile, const TileLogits& s,
                  float logit_scale, const SoftmaxState& state,
                  const TileScratch& scratch) = nullptr;
};

// A fused tile, specialised for one K/V dtype as ProductKernel is: logits,
// online-softmax update and PV of min_rows..max_rows rows of one kv head
// over a tile of at most kFusedMaxKeys keys that every row sees
// (no mask inside, no soft cap). Returns false with the state untouched
// where its arithmetic cannot follow the reference (NaN, infinities, ...):
// the next kernel in TaskKernels then takes the rows.
inline constexpr int64_t kFusedMaxKeys = 32;
struct FusedTileKernel {
  const char* name;
  QueryFormat q_format;
  PrepareQueryRow prepare_q;
  AccOrder acc_order;
  bool e4m3_scaled;
  // Groups of fewer rows than this are left to the products (too few to
  // pay for the tile's fixed 4-row work).
  int64_t min_rows;
  // Rows of one call: a kv head's rows go to it in groups of up to this many.
  int64_t max_rows;
  bool (*tile)(const QueryRows& q, const KvTile& tile, float logit_scale,
               const SoftmaxState& state);
};

// e4m3fn K/V as value * 2^-8 (see above): undone by this factor.
inline constexpr float kE4M3Rescale = 256.0f;

// A kernel's instance for K/V of dtype kv: instance.template operator()<d>()
// for the d of kDtypes that is kv, null where kv is none of them. What each
// kernel file's lookup (e.g. Avx512Wide(kv_dtype)) is made of; dispatch
// calls it once per plan, so no tile function branches on the dtype.
template <class Kernel, DType... kDtypes, class Instance>
const Kernel* KernelForKvDtype(DType kv, const Instance& instance) {
  const Kernel* found = nullptr;
  (void)((kv == kDtypes && (found = instance.template operator()<kDtypes>()) != nullptr) || ...);
  return found;
}

}  // namespace rpa::internal

#endif  // RPA_SRC_KERNEL_TILE_KERNEL_H_
