// The portable row kernel (highway_rows): any K/V dtype converted to f32 in
// registers (highway_load-inl.h), f32 FMA on the dispatched Highway target.
//
// Shapes: logits of 4 rows [4, dim_pad] f32 against one key at a time (one K
// chunk load feeds 4 accumulators; a horizontal sum per row and key); PV of
// 4 rows, one V chunk load per key feeding 4 accumulators kept in registers
// across the tile. q kF32, accumulators kNatural.
//
// Dispatch chooses it for K/V dtypes without an ISA path (f32, int8)
// and for every dtype where the CPU lacks AVX-512 BW, for fewer than
// kPackedMinRows rows per kv head.
// Compiled once per Highway target: include it only through
// hwy/foreach_target.h (highway_kernel.cc).
#if defined(RPA_SRC_KERNEL_HIGHWAY_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RPA_SRC_KERNEL_HIGHWAY_ROWS_INL_H_
#undef RPA_SRC_KERNEL_HIGHWAY_ROWS_INL_H_
#else
#define RPA_SRC_KERNEL_HIGHWAY_ROWS_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"
#include "kernel/highway_load-inl.h"
#include "kernel/tile_kernel.h"

HWY_BEFORE_NAMESPACE();
namespace rpa::internal {
namespace HWY_NAMESPACE {
template <int kRows, typename T>
HWY_INLINE void LogitsRows(const float* q, int64_t q_stride, const KvRows& k_rows,
                           int64_t tokens, int64_t head_dim, float* s, int64_t s_stride) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t body = head_dim / lanes * lanes;
  for (int64_t t = 0; t < tokens; ++t) {
    const T* k = static_cast<const T*>(k_rows[t]);
    VF a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
    auto step = [&](int64_t d, VF kv) HWY_ATTR {
      a0 = hn::MulAdd(hn::LoadU(df, q + d), kv, a0);
      if constexpr (kRows > 1) a1 = hn::MulAdd(hn::LoadU(df, q + q_stride + d), kv, a1);
      if constexpr (kRows > 2) a2 = hn::MulAdd(hn::LoadU(df, q + 2 * q_stride + d), kv, a2);
      if constexpr (kRows > 3) a3 = hn::MulAdd(hn::LoadU(df, q + 3 * q_stride + d), kv, a3);
    };
    for (int64_t d = 0; d < body; d += lanes) step(d, LoadF32(df, k + d));
    if (body < head_dim) {
      step(body, LoadF32Tail(df, k + body, static_cast<size_t>(head_dim - body)));
    }
    s[t] = hn::GetLane(hn::SumOfLanes(df, a0));
    if constexpr (kRows > 1) s[s_stride + t] = hn::GetLane(hn::SumOfLanes(df, a1));
    if constexpr (kRows > 2) s[2 * s_stride + t] = hn::GetLane(hn::SumOfLanes(df, a2));
    if constexpr (kRows > 3) s[3 * s_stride + t] = hn::GetLane(hn::SumOfLanes(df, a3));
  }
}

// acc_r += sum_t p[r][t] * v_t for kRows rows; one V chunk load feeds every
// row, and the accumulators stay in registers across the tile's keys.
template <int kRows, typename T>
HWY_INLINE void PvRows(const float* p, int64_t p_stride, const KvRows& v_rows,
                       int64_t tokens, int64_t head_dim, float* acc, int64_t acc_stride) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t d = 0; d < head_dim; d += lanes) {
    const bool full = d + lanes <= head_dim;
    const size_t tail = static_cast<size_t>(head_dim - d);
    VF a0 = hn::LoadU(df, acc + d), a1 = a0, a2 = a0, a3 = a0;
    if constexpr (kRows > 1) a1 = hn::LoadU(df, acc + acc_stride + d);
    if constexpr (kRows > 2) a2 = hn::LoadU(df, acc + 2 * acc_stride + d);
    if constexpr (kRows > 3) a3 = hn::LoadU(df, acc + 3 * acc_stride + d);
    for (int64_t t = 0; t < tokens; ++t) {
      const T* v = static_cast<const T*>(v_rows[t]) + d;
      const VF vv = full ? LoadF32(df, v) : LoadF32Tail(df, v, tail);
      a0 = hn::MulAdd(hn::Set(df, p[t]), vv, a0);
      if constexpr (kRows > 1) a1 = hn::MulAdd(hn::Set(df, p[p_stride + t]), vv, a1);
      if constexpr (kRows > 2) a2 = hn::MulAdd(hn::Set(df, p[2 * p_stride + t]), vv, a2);
      if constexpr (kRows > 3) a3 = hn::MulAdd(hn::Set(df, p[3 * p_stride + t]), vv, a3);
    }
    hn::StoreU(a0, df, acc + d);
    if constexpr (kRows > 1) hn::StoreU(a1, df, acc + acc_stride + d);
    if constexpr (kRows > 2) hn::StoreU(a2, df, acc + 2 * acc_stride + d);
    if constexpr (kRows > 3) hn::StoreU(a3, df, acc + 3 * acc_stride + d);
  }
}

// s[r][i] = q_r . k_i, 4 rows at a time: each K chunk is converted once
// per 4-row block.
template <typename T>
HWY_NOINLINE void RowsLogits(const QueryRows& q, const KvTile& tile, const TileLogits& s,
                             const TileScratch& /*scratch*/) {
  PrefetchRows(tile.k_next, 0, tile.k_next.count, tile.row_bytes);
  const float* q0 = static_cast<const float*>(q.data);
  ForEachRowBlock<4>(q.rows, [&]<int kRows>(int64_t r) HWY_ATTR {
    LogitsRows<kRows, T>(q0 + r * q.stride, q.stride, tile.k, tile.n, tile.head_dim,
                         s.s + r * s.stride, s.stride);
  });
}

template <typename T>
HWY_NOINLINE void RowsPv(const TileLogits& p, const KvTile& tile, const SoftmaxState& state,
                         const TileScratch& /*scratch*/) {
  PrefetchRows(tile.v_next, 0, tile.v_next.count, tile.row_bytes);
  ForEachRowBlock<4>(p.rows, [&]<int kRows>(int64_t r) HWY_ATTR {
    PvRows<kRows, T>(p.s + r * p.stride, p.stride, tile.v, tile.n, tile.head_dim,
                     state.acc + r * state.stride, state.stride);
  });
}

// The kernel for K/V stored as T (VisitKvElem's tags).
template <typename T>
const ProductKernel kHighwayRows = {"highway_rows",     QueryFormat::kF32, nullptr,
                                    AccOrder::kNatural, /*e4m3_scaled=*/true,
                                    /*prepare_tile=*/nullptr, RowsLogits<T>,
                                    RowsPv<T>};

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace rpa::internal
HWY_AFTER_NAMESPACE();

#endif  // RPA_SRC_KERNEL_HIGHWAY_ROWS_INL_H_
