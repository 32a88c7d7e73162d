// The AVX-512 BF16 packed prefill kernel: both products by vdpbf16ps (pairs
// of bf16 multiplied and summed into f32 lanes) on tiles packed once.
//
// Arithmetic: per KV tile, K is packed into dimension pairs and V into key
// pairs, exactly as the AMX kernel packs them (bf16_pairs.h's AmxPackKeys /
// AmxPackValues, AVX-512 BF16 code; fp8 and int8 exact, e4m3fn at its true
// value). Logits: per pair of dims, one load of 16 keys' pairs and a
// broadcast of each row's q pair feed one vdpbf16ps per row and 16 keys;
// PV: per pair of keys, one load of 16 dims' pairs and a broadcast of each
// row's weight pair. The softmax between them is the task loop's (f32); its
// weights are rounded to bf16 in place (as the AMX kernel does), the LSE
// sums the unrounded ones. Error as amx_prefill's: the weights' bf16
// rounding, inside the contract's bf16 tolerance.
//
// Shapes: blocks of 8 rows x 32 keys (logits) or 32 dims (PV): 16 f32
// accumulators, 2 loads and 8 broadcasts per 16 vdpbf16ps. q [rows,
// dim_pad] bf16; K packed [dim_pad / 2][RoundUp(n, 32)][2], V packed
// [RoundUp(n, 32) / 2][RoundUp(head_dim, 16)][2], both in TileScratch::packed
// (K's then V's, packed once per tile by PrepareTile; the task loop then
// runs the rows in chunks of kRowChunk); rows padded to 16 in scratch (the
// weights' conversion writes whole 16-row blocks).
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

namespace rpa::internal {
namespace {

using avx512::BroadcastPair;
using avx512::DotBf16;
using avx512::Lanes16;

constexpr int kBlockRows = 8;

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

template <int kRows>
RPA_AVX512_BF16_TARGET void LogitsBlock(const LogitsBlockArgs& a, int64_t j0) {
  __m512 acc0[kRows], acc1[kRows];
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
  const __mmask16 low = Lanes16(a.keys), high = Lanes16(a.keys - 16);
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    float* row = a.s + r * a.s_stride;
    _mm512_mask_storeu_ps(row, low, acc0[r]);
    _mm512_mask_storeu_ps(row + 16, high, acc1[r]);
  }
}

// Calls fn.template operator()<k>(r) for blocks of k <= kBlockRows rows.
template <class Fn>
RPA_AVX512_BF16_TARGET __attribute__((always_inline)) inline void ForEachRowBlock(int64_t rows,
                                                                           const Fn& fn) {
  int64_t r = 0;
  for (; r + kBlockRows <= rows; r += kBlockRows) fn.template operator()<kBlockRows>(r);
  switch (rows - r) {
    case 7: fn.template operator()<7>(r); break;
    case 6: fn.template operator()<6>(r); break;
    case 5: fn.template operator()<5>(r); break;
    case 4: fn.template operator()<4>(r); break;
    case 3: fn.template operator()<3>(r); break;
    case 2: fn.template operator()<2>(r); break;
    case 1: fn.template operator()<1>(r); break;
    default: break;
  }
}

// The tile's packs in scratch.packed, K's then V's: [dim_pad / 2][n32][2]
// and [n32 / 2][d16][2] bf16 (2 x n32 x dim_pad bf16 at most: the buffer's
// n32 x dim_pad f32).
uint16_t* PackedKeys(const TileScratch& scratch) {
  return reinterpret_cast<uint16_t*>(scratch.packed);
}
uint16_t* PackedValues(const KvTile& tile, const TileScratch& scratch) {
  return PackedKeys(scratch) + AmxRoundUp(tile.n, kAmxKeyAlign) * scratch.dim_pad;
}

// Packs the tile's K and V once for all its row chunks (prefetching the
// next tile's rows first).
template <DType kDtype>
void PrepareTile(const KvTile& tile, const TileScratch& scratch) {
  static_assert(kAmxDimAlign == kDimAlign && kAmxVDimAlign <= kDimAlign);
  using Packs = TilePacks<kDtype, NextTilePrefetch::kUpFront>;
  Packs::Keys(tile, scratch);  // At PackedKeys.
  TileScratch values = scratch;
  values.packed = reinterpret_cast<float*>(PackedValues(tile, scratch));
  Packs::Values(tile, values);
}

template <DType kDtype>
RPA_AVX512_BF16_TARGET void Logits(const QueryRows& q, const KvTile& tile, const TileLogits& s,
                            const TileScratch& scratch) {
  if (q.rows <= 0 || tile.n <= 0) return;
  const uint16_t* kp = PackedKeys(scratch);  // PrepareTile's.
  const int64_t n32 = AmxRoundUp(tile.n, kAmxKeyAlign);
  ForEachRowBlock(q.rows, [&]<int kRows>(int64_t r) RPA_AVX512_BF16_TARGET {
    LogitsBlockArgs a{static_cast<const uint16_t*>(q.data) + r * q.stride,
                      q.stride,
                      kp,
                      n32,
                      AmxRoundUp(tile.head_dim, kAmxDimAlign) / 2,
                      nullptr,
                      s.stride,
                      0};
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

template <DType kDtype>
RPA_AVX512_BF16_TARGET void Pv(const TileLogits& p, const KvTile& tile, const SoftmaxState& state,
                        const TileScratch& scratch) {
  if (p.rows <= 0 || tile.n <= 0) return;
  const uint16_t* vp = PackedValues(tile, scratch);  // PrepareTile's.
  const uint16_t* weights = WeightsToBf16InPlace(p, tile.n);
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
    "avx512_bf16_packed", QueryFormat::kBf16,    PrepareBf16Row, AccOrder::kNatural,
    /*e4m3_scaled=*/false,  /*prepare_tile=*/PrepareTile<kDtype>,
    Logits<kDtype>,         Pv<kDtype>};

}  // namespace

const ProductKernel* Avx512Bf16Packed(DType kv_dtype) {
  return KernelForKvDtype<ProductKernel, DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2,
                          DType::kI8>(kv_dtype, []<DType kDtype>() { return &kPacked<kDtype>; });
}

}  // namespace rpa::internal

#endif  // __x86_64__
