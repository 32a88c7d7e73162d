// The AVX-512 BF16 packed prefill kernel: both products by vdpbf16ps (pairs
// of bf16 multiplied and summed into f32 lanes) on tiles packed once.
//
// Arithmetic: per KV tile, K is packed into dimension pairs and V into key
// pairs, exactly as the AMX kernel packs them (bf16_pairs.h's AmxPackKeys /
// AmxPackValues, AVX-512 BF16 code; fp8 and int8 exact, e4m3fn at its true
// value). Logits: per pair of dims, one load of 16 keys' pairs and a
// broadcast of each row's q pair feed one vdpbf16ps per row and 16 keys;
// PV: per pair of keys, one load of 16 dims' pairs and a broadcast of each
// row's weight pair. The softmax is fused into the logits where the tile
// allows (Weights: each block's products become bf16 weights in registers,
// against a lazy per-row reference, lazy_softmax_bf16.h); elsewhere it is the
// task loop's (f32) between them, its weights rounded to bf16 in place (as
// the AMX kernel does). The LSE sums the unrounded weights either way.
// Error as amx_prefill's: the weights' bf16 rounding, inside the contract's
// bf16 tolerance (the fused exp adds ~1e-6 relative).
//
// Shapes: blocks of 8 rows x 32 keys (logits) or 32 dims (PV): 16 f32
// accumulators, 2 loads and 8 broadcasts per 16 vdpbf16ps. q [rows,
// dim_pad] bf16; K packed [dim_pad / 2][RoundUp(n, 32)][2], V packed
// [RoundUp(n, 32) / 2][RoundUp(head_dim, 16)][2], both in
// TileScratch::packed (K's then V's, packed once per tile by
// TilePacks::KeysAndValues; the task loop then runs the rows in chunks of
// kRowChunk); rows padded to 16 in scratch (the weights' conversion writes
// whole 16-row blocks).
//
// Dispatch chooses it for the prefill class with bf16 q and bf16/fp8/int8
// K/V where vdpbf16ps runs at the FMA's issue rate (AMD Zen 4 measured
// 2026-12-01: 235 against the f32 FMA's 118 GFLOP/s per core); on the Intel
// CPUs measured before, vdpbf16ps issues at half the FMA's rate and the f32
// packed kernel stays.
#include "kernel/avx512_bf16_packed.h"

#if defined(__x86_64__)
#include <algorithm>

#include "kernel/avx512_common.h"
#include "kernel/bf16_pairs.h"
#include "kernel/lazy_softmax_bf16.h"

namespace rpa::internal {
namespace {

using avx512::BroadcastPair;
using avx512::DotBf16;
using avx512::Lanes16;

using lazy_softmax::ForEachRowBlock;
using lazy_softmax::kBlockRows;

// s rows [r0, r0 + kRows) x keys [j0, j0 + 32) (those below n).
struct LogitsBlockArgs {
  const uint16_t* q;   // Row r0's q.
  int64_t q_stride;    // Elements.
  const uint16_t* kp;  // Packed K.
  int64_t n32;         // Its keys per pair row.
  int64_t pairs;       // dim_pad / 2.
  float* s;            // Row r0, key j0.
  int64_t s_stride;
  int64_t keys;        // Keys of the block below n (1..32).
};

// The q . k dot products of rows [0, kRows) and keys [j0, j0 + 32): keys
// j0.. j0 + 15 in acc0[r], the next 16 in acc1[r].
template <int kRows>
RPA_AVX512_BF16_TARGET __attribute__((always_inline)) inline void BlockDots(
    const LogitsBlockArgs& a, int64_t j0, __m512* acc0, __m512* acc1) {
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  const uint16_t* k = a.kp + 2 * j0;
  for (int64_t p = 0; p < a.pairs; ++p) {
    const __m512i k0 = _mm512_loadu_si512(k + 2 * p * a.n32);
    const __m512i k1 = _mm512_loadu_si512(k + 2 * p * a.n32 + 32);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512i qp = BroadcastPair(a.q + r * a.q_stride + 2 * p);
      acc0[r] = DotBf16(acc0[r], qp, k0);
      acc1[r] = DotBf16(acc1[r], qp, k1);
    }
  }
}

template <int kRows>
RPA_AVX512_BF16_TARGET void LogitsBlock(const LogitsBlockArgs& a, int64_t j0) {
  __m512 acc0[kRows], acc1[kRows];
  BlockDots<kRows>(a, j0, acc0, acc1);
  const __mmask16 low = Lanes16(a.keys), high = Lanes16(a.keys - 16);
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    float* row = a.s + r * a.s_stride;
    _mm512_mask_storeu_ps(row, low, acc0[r]);
    _mm512_mask_storeu_ps(row + 16, high, acc1[r]);
  }
}

// The arguments of BlockDots for rows [r, ...) of q over the tile's packed
// K (the s fields unset).
LogitsBlockArgs DotArgs(const QueryRows& q, int64_t r, const KvTile& tile,
                        const TileScratch& scratch) {
  return {static_cast<const uint16_t*>(q.data) + r * q.stride,
          q.stride,
          PackedTileKeys(scratch),  // prepare_tile's.
          AmxRoundUp(tile.n, kAmxKeyAlign),
          AmxRoundUp(tile.head_dim, kAmxDimAlign) / 2,
          nullptr,
          0,
          0};
}

template <DType kDtype>
RPA_AVX512_BF16_TARGET void Logits(const QueryRows& q, const KvTile& tile, const TileLogits& s,
                            const TileScratch& scratch) {
  if (q.rows <= 0 || tile.n <= 0) return;
  ForEachRowBlock(q.rows, [&]<int kRows>(int64_t r) RPA_AVX512_BF16_TARGET {
    LogitsBlockArgs a = DotArgs(q, r, tile, scratch);
    a.s_stride = s.stride;
    const int64_t keys = KeysNeeded(s, r, kRows, tile.n);
    for (int64_t j0 = 0; j0 < keys; j0 += 32) {
      a.s = s.s + r * s.stride + j0;
      a.keys = std::min<int64_t>(tile.n - j0, 32);
      LogitsBlock<kRows>(a, j0);
    }
  });
}

// acc rows [r0, r0 + kRows) x dims [d0, d0 + 32) (16 where only 16 are left).
struct PvBlockArgs {
  const uint16_t* pb;  // Row r0's bf16 weights.
  int64_t pb_stride;   // n32.
  const uint16_t* vp;  // Packed V.
  int64_t d16;         // Its dims per key pair.
  int64_t key_pairs;   // Up to n32 / 2: the pairs the rows need.
  float* acc;          // Row r0.
  int64_t acc_stride;
};

template <int kRows>
RPA_AVX512_BF16_TARGET void PvBlock(const PvBlockArgs& a, int64_t d0) {
  const bool two = d0 + 16 < a.d16;
  __m512 acc0[kRows], acc1[kRows];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    acc0[r] = _mm512_loadu_ps(a.acc + r * a.acc_stride + d0);
    acc1[r] = two ? _mm512_loadu_ps(a.acc + r * a.acc_stride + d0 + 16) : _mm512_setzero_ps();
  }
  const uint16_t* v = a.vp + 2 * d0;
  for (int64_t j = 0; j < a.key_pairs; ++j) {
    const __m512i v0 = _mm512_loadu_si512(v + 2 * j * a.d16);
    const __m512i v1 = two ? _mm512_loadu_si512(v + 2 * j * a.d16 + 32) : _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512i w = BroadcastPair(a.pb + r * a.pb_stride + 2 * j);
      acc0[r] = DotBf16(acc0[r], w, v0);
      acc1[r] = DotBf16(acc1[r], w, v1);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    _mm512_storeu_ps(a.acc + r * a.acc_stride + d0, acc0[r]);
    if (two) _mm512_storeu_ps(a.acc + r * a.acc_stride + d0 + 16, acc1[r]);
  }
}

// The products of rows [r, r + kRows) and keys [j0, j0 + 32) in registers:
// lazy_softmax's Source.
struct RegisterDots {
  const QueryRows& q;
  const KvTile& tile;
  const TileScratch& scratch;
  template <int kRows>
  RPA_AVX512_BF16_TARGET __attribute__((always_inline)) void Dots(int64_t r, int64_t j0,
                                                                  __m512* t0, __m512* t1) const {
    BlockDots<kRows>(DotArgs(q, r, tile, scratch), j0, t0, t1);
  }
};

// ProductKernel::weights: the lazy softmax on the products in registers.
template <DType kDtype>
RPA_AVX512_BF16_TARGET bool Weights(const QueryRows& q, const KvTile& tile, const TileLogits& s,
                                    float logit_scale, const SoftmaxState& state,
                                    const TileScratch& scratch) {
  return lazy_softmax::Weights(RegisterDots{q, tile, scratch}, q.rows, tile.n, s, logit_scale,
                               state);
}

template <DType kDtype>
RPA_AVX512_BF16_TARGET void Pv(const TileLogits& p, const KvTile& tile, const SoftmaxState& state,
                        const TileScratch& scratch) {
  if (p.rows <= 0 || tile.n <= 0) return;
  const uint16_t* vp = PackedTileValues(tile, scratch);  // prepare_tile's.
  const uint16_t* weights = p.bf16_weights ? reinterpret_cast<const uint16_t*>(p.s)
                                           : WeightsToBf16InPlace(p, tile.n);
  const int64_t n32 = AmxRoundUp(tile.n, kAmxKeyAlign);
  const int64_t d16 = AmxRoundUp(tile.head_dim, kAmxVDimAlign);
  ForEachRowBlock(p.rows, [&]<int kRows>(int64_t r) RPA_AVX512_BF16_TARGET {
    const int64_t key_pairs = (KeysNeeded(p, r, kRows, tile.n) + 1) / 2;
    const PvBlockArgs a{weights + r * n32, n32, vp, d16, key_pairs,
                        state.acc + r * state.stride, state.stride};
    for (int64_t d0 = 0; d0 < d16; d0 += 32) PvBlock<kRows>(a, d0);
  });
}

template <DType kDtype>
constexpr ProductKernel kPacked = {
    "avx512_bf16_packed",  QueryFormat::kBf16,
    PrepareBf16Row,        AccOrder::kNatural,
    /*e4m3_scaled=*/false, TilePacks<kDtype, NextTilePrefetch::kUpFront>::KeysAndValues,
    Logits<kDtype>,        Pv<kDtype>,
    Weights<kDtype>};

}  // namespace

const ProductKernel* Avx512Bf16Packed(DType kv_dtype) {
  return KernelForKvDtype<ProductKernel, DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2,
                          DType::kI8>(kv_dtype, []<DType kDtype>() { return &kPacked<kDtype>; });
}

}  // namespace rpa::internal

#endif  // __x86_64__
