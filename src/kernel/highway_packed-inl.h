// The portable packed kernel (highway_packed): many rows per kv head
// (prefill, chunked prefill). With R rows sharing a KV tile, converting the
// tile to f32 once (K transposed, V as is) costs about 1/R of the products,
// and both products become register-blocked outer products: kPackedRows
// rows x 2 vectors of keys (or dimensions) per block, one broadcast per row
// and step, no horizontal sums and no conversion inside the loops.
//
// Shapes: K tile packed [dim_pad, RoundUp(n, 2 lanes)] f32 (transposed by
// Lanes x Lanes register blocks), V tile [n, dim_pad] f32, both in
// TileScratch::packed (one after the other: PV packs V over the logits'
// K). q kF32, accumulators kNatural.
//
// Dispatch chooses it for kPackedMinRows or more rows per kv head, every
// K/V dtype, every CPU.
// Compiled once per Highway target: include it only through
// hwy/foreach_target.h (highway_kernel.cc).
#if defined(RPA_SRC_KERNEL_HIGHWAY_PACKED_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RPA_SRC_KERNEL_HIGHWAY_PACKED_INL_H_
#undef RPA_SRC_KERNEL_HIGHWAY_PACKED_INL_H_
#else
#define RPA_SRC_KERNEL_HIGHWAY_PACKED_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include "hwy/highway.h"
#include "kernel/highway_load-inl.h"
#include "kernel/highway_outer_product-inl.h"
#include "kernel/scratch.h"
#include "kernel/tile_kernel.h"

HWY_BEFORE_NAMESPACE();
namespace rpa::internal {
namespace HWY_NAMESPACE {
inline constexpr int kPackedRows = HWY_MAX_BYTES >= 64 ? 8 : 4;  // 16 or 8 accumulators.
// Keys of a packed K tile are padded to 2 vectors (kt_stride), at most kPackedTokenAlign.
static_assert(2 * hn::MaxLanes(DF()) <= kPackedTokenAlign, "packed K tile padding");

// Lanes [d0, d0 + dims) of key i as f32; zero for a padding key (i >= n).
template <typename T>
HWY_INLINE VF KeyPiece(const KvRows& k_rows, int64_t i, int64_t n, int64_t d0, int64_t dims) {
  const DF df;
  if (i >= n) return hn::Zero(df);
  const T* k = static_cast<const T*>(k_rows[i]) + d0;
  return dims == static_cast<int64_t>(hn::Lanes(df))
             ? LoadF32(df, k)
             : LoadF32Tail(df, k, static_cast<size_t>(dims));
}

#if !HWY_HAVE_SCALABLE

// An L x L transpose (L = Lanes): v[j] lane c becomes v[c] lane j. Within
// each 128-bit block a 4 x 4 transpose (rows interleaved by element, then by
// element pair); with more blocks, the blocks are then transposed too.
HWY_INLINE void TransposeSquare(VF* v) {
#if HWY_TARGET == HWY_SCALAR
  (void)v;  // 1 x 1.
#else
  const DF df;
  const hn::Repartition<uint64_t, DF> d64;
  const size_t lanes = hn::Lanes(df);
  for (size_t i = 0; i < lanes; i += 2) {
    const VF lo = hn::InterleaveLower(df, v[i], v[i + 1]);
    v[i + 1] = hn::InterleaveUpper(df, v[i], v[i + 1]);
    v[i] = lo;
  }
  VF u[hn::MaxLanes(DF())];
  for (size_t g = 0; g < lanes; g += 4) {  // u[g + k], block L: rows g..g+3 of column 4L + k.
    const auto a = hn::BitCast(d64, v[g]), b = hn::BitCast(d64, v[g + 1]);
    const auto c = hn::BitCast(d64, v[g + 2]), e = hn::BitCast(d64, v[g + 3]);
    u[g] = hn::BitCast(df, hn::InterleaveLower(d64, a, c));
    u[g + 1] = hn::BitCast(df, hn::InterleaveUpper(d64, a, c));
    u[g + 2] = hn::BitCast(df, hn::InterleaveLower(d64, b, e));
    u[g + 3] = hn::BitCast(df, hn::InterleaveUpper(d64, b, e));
  }
  // Column 4L + k takes block L of u[k], u[4 + k], ...: (a0 b0 a2 b2) and
  // (a1 b1 a3 b3) of two vectors, then their 256-bit halves.
  auto even_blocks = [](VF a, VF b) HWY_ATTR {
    return hn::OddEvenBlocks(hn::SwapAdjacentBlocks(b), a);
  };
  auto odd_blocks = [](VF a, VF b) HWY_ATTR {
    return hn::OddEvenBlocks(b, hn::SwapAdjacentBlocks(a));
  };
  for (size_t k = 0; k < 4; ++k) {
    if (lanes == 4) {
      v[k] = u[k];
    } else if (lanes == 8) {
      v[k] = even_blocks(u[k], u[4 + k]);
      v[4 + k] = odd_blocks(u[k], u[4 + k]);
    } else {
      const VF lo1 = even_blocks(u[k], u[4 + k]), hi1 = odd_blocks(u[k], u[4 + k]);
      const VF lo2 = even_blocks(u[8 + k], u[12 + k]), hi2 = odd_blocks(u[8 + k], u[12 + k]);
      v[k] = hn::ConcatLowerLower(df, lo2, lo1);
      v[4 + k] = hn::ConcatLowerLower(df, hi2, hi1);
      v[8 + k] = hn::ConcatUpperUpper(df, lo2, lo1);
      v[12 + k] = hn::ConcatUpperUpper(df, hi2, hi1);
    }
  }
#endif
}

// kt[d * kt_stride + i] = f32 of k_i[d] for i < n, d < head_dim; keys
// [n, RoundUp(n, 2 * Lanes)) are zero. Lanes x Lanes blocks are transposed
// in registers, so every store is a whole vector of kt.
template <typename T>
HWY_NOINLINE void PackKeysTransposed(const KvRows& k_rows, int64_t n, int64_t head_dim,
                                     float* kt, int64_t kt_stride) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t n_pad = RoundUp(n, 2 * lanes);
  for (int64_t i0 = 0; i0 < n_pad; i0 += lanes) {
    for (int64_t d0 = 0; d0 < head_dim; d0 += lanes) {
      const int64_t dims = std::min(lanes, head_dim - d0);
      VF v[hn::MaxLanes(DF())];
      for (int64_t j = 0; j < lanes; ++j) v[j] = KeyPiece<T>(k_rows, i0 + j, n, d0, dims);
      TransposeSquare(v);
      for (int64_t c = 0; c < dims; ++c) hn::StoreU(v[c], df, kt + (d0 + c) * kt_stride + i0);
    }
  }
}

#else  // HWY_HAVE_SCALABLE

// As above, but sizeless vectors cannot form TransposeSquare's register
// block: each key's piece goes through memory down its column of kt.
template <typename T>
HWY_NOINLINE void PackKeysTransposed(const KvRows& k_rows, int64_t n, int64_t head_dim,
                                     float* kt, int64_t kt_stride) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t n_pad = RoundUp(n, 2 * lanes);
  HWY_ALIGN float piece[hn::MaxLanes(DF())];
  for (int64_t i = 0; i < n_pad; ++i) {
    for (int64_t d0 = 0; d0 < head_dim; d0 += lanes) {
      const int64_t dims = std::min(lanes, head_dim - d0);
      hn::Store(KeyPiece<T>(k_rows, i, n, d0, dims), df, piece);
      for (int64_t c = 0; c < dims; ++c) kt[(d0 + c) * kt_stride + i] = piece[c];
    }
  }
}

#endif  // HWY_HAVE_SCALABLE

// vp[i * dim_pad + d] = f32 of v_i[d], zero for d in [head_dim, dim_pad).
template <typename T>
HWY_NOINLINE void PackValues(const KvRows& v_rows, int64_t n, int64_t head_dim,
                             float* vp, int64_t dim_pad) {
  for (int64_t i = 0; i < n; ++i) {
    RowToF32(static_cast<const T*>(v_rows[i]), head_dim, dim_pad, vp + i * dim_pad);
  }
}

// s[r][j] = q_r . k_j for every row and the keys it needs, K packed
// transposed at kt.
HWY_NOINLINE void PackedLogits(const QueryRows& q, const float* kt, int64_t kt_stride,
                               const KvTile& tile, const TileLogits& s) {
  const int64_t step = 2 * static_cast<int64_t>(hn::Lanes(DF()));
  const OuterProduct g{static_cast<const float*>(q.data), q.stride, 1, kt, kt_stride,
                       tile.head_dim, s.s, s.stride, /*accumulate=*/false};
  const int64_t n = tile.n;
  ForEachRowBlock<kPackedRows>(q.rows, [&]<int kRows>(int64_t r) HWY_ATTR {
    const int64_t keys = KeysNeeded(s, r, kRows, n);
    for (int64_t j = 0; j < keys; j += step) {
      OuterProductBlock<kRows, 2>(g, {r, j, std::min(step, n - j)});
    }
  });
}

// acc_r += sum_i p[r][i] * v_i for every row and the keys it needs, V packed
// at vp [n, dim_pad].
HWY_NOINLINE void PackedPv(const TileLogits& p, const float* vp, int64_t n, int64_t dim_pad,
                           const SoftmaxState& state) {
  const int64_t step = 2 * static_cast<int64_t>(hn::Lanes(DF()));
  const OuterProduct g{p.s, p.stride, 1, vp, dim_pad, n, state.acc, state.stride,
                       /*accumulate=*/true};
  ForEachRowBlock<kPackedRows>(p.rows, [&]<int kRows>(int64_t r) HWY_ATTR {
    OuterProduct block = g;
    block.k_count = KeysNeeded(p, r, kRows, n);
    for (int64_t d = 0; d < dim_pad; d += step) OuterProductBlock<kRows, 2>(block, {r, d, step});
  });
}

template <typename T>
void PackedTileLogits(const QueryRows& q, const KvTile& tile, const TileLogits& s,
                      const TileScratch& scratch) {
  PrefetchRows(tile.k_next, 0, tile.k_next.count, tile.row_bytes);
  const int64_t kt_stride = RoundUp(tile.n, 2 * static_cast<int64_t>(hn::Lanes(DF())));
  PackKeysTransposed<T>(tile.k, tile.n, tile.head_dim, scratch.packed, kt_stride);
  PackedLogits(q, scratch.packed, kt_stride, tile, s);
}

template <typename T>
void PackedTilePv(const TileLogits& p, const KvTile& tile, const SoftmaxState& state,
                  const TileScratch& scratch) {
  PrefetchRows(tile.v_next, 0, tile.v_next.count, tile.row_bytes);
  PackValues<T>(tile.v, tile.n, tile.head_dim, scratch.packed, scratch.dim_pad);
  PackedPv(p, scratch.packed, tile.n, scratch.dim_pad, state);
}

// The kernel for K/V stored as T (VisitKvElem's tags).
template <typename T>
const ProductKernel kHighwayPacked = {"highway_packed",   QueryFormat::kF32, nullptr,
                                      AccOrder::kNatural, /*e4m3_scaled=*/true,
                                      /*prepare_tile=*/nullptr, PackedTileLogits<T>,
                                      PackedTilePv<T>};

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace rpa::internal
HWY_AFTER_NAMESPACE();

#endif  // RPA_SRC_KERNEL_HIGHWAY_PACKED_INL_H_
