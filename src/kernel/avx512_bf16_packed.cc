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
// against a lazy per-row reference, docs/kernel.md); elsewhere it is the
// task loop's (f32) between them, its weights rounded to bf16 in place (as
// the AMX kernel does). The LSE sums the unrounded weights either way.
// Error as amx_prefill's: the weights' bf16 rounding, inside the contract's
// bf16 tolerance (the fused exp adds ~1e-6 relative).
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
#include <cmath>
#include <limits>

#include "kernel/avx512_common.h"
#include "kernel/bf16_pairs.h"
#include "kernel/softmax_finish.h"

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

// The arguments of BlockDots for rows [r, ...) of q over the tile's packed
// K (the s fields unset).
LogitsBlockArgs DotArgs(const QueryRows& q, int64_t r, const KvTile& tile,
                        const TileScratch& scratch) {
  return {static_cast<const uint16_t*>(q.data) + r * q.stride,
          q.stride,
          PackedKeys(scratch),  // PrepareTile's.
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

// The fused softmax's reference for a row's weights may trail its largest
// logit by up to ln 256 (weights up to 2^kLazyLag2 = 256, far inside f32's
// range): a block of keys raises it only when one of its logits passes it
// by more, so most blocks skip the horizontal maximum. Any reference gives
// the same softmax: m and l stay relative to it (FinishRow and the split
// merges need them consistent, not m the maximum).
constexpr float kLazyLag2 = 8.0f;  // In log2 units, as WeightsBlock's t.

// 2^t in the lanes of keep (0 in the others and below 2^-125; NaN stays
// NaN): n = round(t), 2^(t - n) by a degree-5 polynomial fitted to it over
// [-1/2, 1/2] (relative error 2e-7 in f32), times 2^n by vscalefps. WeightsBlock's exp:
// with the logit's scale, log2 e and the row's reference folded into the
// one multiply-add that makes t, it takes half the instructions of
// ExpNonPositive (the softmax's exp, whose two-step ln 2 reduction and
// degree 7 keep f32's accuracy); t's own rounding costs ~1e-6 relative,
// 1/1000 of the bf16 rounding the weights get next.
RPA_AVX512_BF16_TARGET inline __m512 Exp2(__m512 t, __mmask16 keep) {
  constexpr float kPoly[6] = {1.0000001192092896f,  0.6931470036506653f,
                              0.24022118747234344f, 0.05550695210695267f,
                              0.009675590321421623f, 0.001328230369836092f};
  // Not below -125 (NaN included: it stays NaN, which the sums show).
  const __mmask16 normal =
      _mm512_mask_cmp_ps_mask(keep, t, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 poly = _mm512_set1_ps(kPoly[5]);
#pragma GCC unroll 5
  for (int k = 4; k >= 0; --k) poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(kPoly[k]));
  return _mm512_maskz_scalef_ps(normal, poly, n);
}

// One row's softmax in WeightsBlock: the reference its weights are relative
// to (from the state's m), their sum (lane-wise), and the keys it sees.
struct LazyRow {
  float ref;
  __m512 sum;
  int64_t keys;
};

// 16 bf16 as f32.
RPA_AVX512_BF16_TARGET inline __m512 WidenBf16(__m256i half) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

// A row's bf16 weights [0, j0) (Pv's layout) times a, where its reference
// rose at key block j0 (rounded to bf16 again: a second rounding, rare).
RPA_AVX512_BF16_TARGET void RescaleWeights(uint16_t* w, int64_t j0, float a) {
  const __m512 va = _mm512_set1_ps(a);
  for (int64_t i = 0; i < j0; i += 32) {
    const __m512i x = _mm512_loadu_si512(w + i);
    const __m512 lo = WidenBf16(_mm512_castsi512_si256(x));
    const __m512 hi = WidenBf16(_mm512_extracti64x4_epi64(x, 1));
    _mm512_storeu_si512(w + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(
                                   _mm512_mul_ps(hi, va), _mm512_mul_ps(lo, va))));
  }
}

// The largest lane of x0 in valid0 and of x1 in valid1 (-inf if none).
RPA_AVX512_BF16_TARGET inline float MaskedMax(__m512 x0, __m512 x1, __mmask16 valid0,
                                              __mmask16 valid1) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_mask_mov_ps(neg_inf, valid0, x0),
                                            _mm512_mask_mov_ps(neg_inf, valid1, x1)));
}

// A row's first reference (its state had none: -inf): the largest logit
// of the block that it sees; still -inf where all are (the commit then
// declines). False: one is +inf or NaN.
RPA_AVX512_BF16_TARGET inline bool FirstReference(__m512 x0, __m512 x1, __mmask16 valid0,
                                                  __mmask16 valid1, LazyRow& row) {
  const float top = MaskedMax(x0, x1, valid0, valid1);
  if (!(top < std::numeric_limits<float>::infinity())) return false;
  row.ref = top;
  return true;
}

// Where a row's t (below) passes the lag in block j0: its reference raised
// by the largest, its weights so far and their sum scaled down to match, its
// t lowered. False: that largest is +inf or NaN.
RPA_AVX512_BF16_TARGET inline bool RaiseReference(__m512& t0, __m512& t1, __mmask16 valid0,
                                                  __mmask16 valid1, int64_t j0, uint16_t* w,
                                                  LazyRow& row) {
  const float top = MaskedMax(t0, t1, valid0, valid1);
  if (top <= kLazyLag2) return true;  // Another row's.
  if (!(top < std::numeric_limits<float>::infinity())) return false;
  const float rescale = std::exp2(-top);
  RescaleWeights(w, j0, rescale);
  row.sum = _mm512_mul_ps(row.sum, _mm512_set1_ps(rescale));
  row.ref += top * 0.693147181f;  // ln 2: t is in log2 units.
  t0 = _mm512_sub_ps(t0, _mm512_set1_ps(top));
  t1 = _mm512_sub_ps(t1, _mm512_set1_ps(top));
  return true;
}

// Rows [0, kRows) of a.q, per 32-key block: the dot products (BlockDots),
// then in registers t = (logit - reference) log2 e, the references raised
// where a t passes the lag (one test per block), 2^t for the keys each row
// sees (0 past them) summed into the row's sum and stored as bf16 at w + r
// * w_stride. A NaN logit makes the sum NaN (Exp2 keeps it); false: a +inf
// or NaN logit where a reference was set or raised.
template <int kRows>
RPA_AVX512_BF16_TARGET bool WeightsBlock(const LogitsBlockArgs& a, float logit_scale,
                                         uint16_t* w, int64_t w_stride, LazyRow* rows) {
  constexpr float kLog2E = 1.44269504f;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  int64_t keys = 0;
  for (int r = 0; r < kRows; ++r) keys = std::max(keys, rows[r].keys);
  const __m512 scale = _mm512_set1_ps(logit_scale);
  const __m512 scale_log2e = _mm512_set1_ps(logit_scale * kLog2E);
  for (int64_t j0 = 0; j0 < keys; j0 += 32) {
    __m512 t0[kRows], t1[kRows];  // The dots, then t.
    BlockDots<kRows>(a, j0, t0, t1);
    __mmask16 valid0[kRows], valid1[kRows];
    __m512 top = _mm512_set1_ps(-kInf);  // The block's largest t, over the keys seen.
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      LazyRow& row = rows[r];
      valid0[r] = Lanes16(row.keys - j0);
      valid1[r] = Lanes16(row.keys - j0 - 16);
      if (row.ref == -kInf && row.keys > j0 &&
          !FirstReference(_mm512_mul_ps(t0[r], scale), _mm512_mul_ps(t1[r], scale), valid0[r],
                          valid1[r], row)) {
        return false;
      }
      const __m512 shift = _mm512_set1_ps(-row.ref * kLog2E);
      t0[r] = _mm512_fmadd_ps(t0[r], scale_log2e, shift);
      t1[r] = _mm512_fmadd_ps(t1[r], scale_log2e, shift);
      top = _mm512_mask_max_ps(top, valid0[r], top, t0[r]);
      top = _mm512_mask_max_ps(top, valid1[r], top, t1[r]);
    }
    if (_mm512_cmp_ps_mask(top, _mm512_set1_ps(kLazyLag2), _CMP_GT_OQ) != 0) {
      for (int r = 0; r < kRows; ++r) {
        if (!RaiseReference(t0[r], t1[r], valid0[r], valid1[r], j0, w + r * w_stride, rows[r])) {
          return false;
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512 p0 = Exp2(t0[r], valid0[r]), p1 = Exp2(t1[r], valid1[r]);
      rows[r].sum = _mm512_add_ps(rows[r].sum, _mm512_add_ps(p0, p1));
      _mm512_storeu_si512(w + r * w_stride + j0,
                          reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p1, p0)));
    }
  }
  return true;
}

// Each row's state moved to its reference (MoveToReference, as SoftmaxRow
// does), the accumulator rescaled where the reference rose.
RPA_AVX512_BF16_TARGET void CommitRow(const LazyRow& row, float sum, const SoftmaxState& state,
                                      int64_t r) {
  if (row.keys <= 0) return;  // The row sees no key of the tile.
  const float alpha = MoveToReference(row.ref, sum, state.m + r, state.l + r);
  if (alpha == 1.0f) return;
  float* acc = state.acc + r * state.stride;
  for (int64_t d = 0; d < state.stride; d += 16) {
    _mm512_storeu_ps(acc + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), _mm512_set1_ps(alpha)));
  }
}

// ProductKernel::weights: WeightsBlock over the rows' blocks, then, if none
// declined and every row that sees a key has a finite reference, the
// commits.
template <DType kDtype>
RPA_AVX512_BF16_TARGET bool Weights(const QueryRows& q, const KvTile& tile, const TileLogits& s,
                                    float logit_scale, const SoftmaxState& state,
                                    const TileScratch& scratch) {
  if (q.rows > kRowChunk) return false;
  if (q.rows <= 0 || tile.n <= 0) return true;
  LazyRow rows[kRowChunk];
  for (int64_t r = 0; r < q.rows; ++r) {
    if (std::isnan(state.m[r])) return false;  // A poisoned row: SoftmaxRow's.
    rows[r] = {state.m[r], _mm512_setzero_ps(), s.needed != nullptr ? s.needed[r] : tile.n};
  }
  const int64_t n32 = AmxRoundUp(tile.n, kAmxKeyAlign);
  uint16_t* w = reinterpret_cast<uint16_t*>(s.s);
  bool ok = true;
  ForEachRowBlock(q.rows, [&]<int kRows>(int64_t r) RPA_AVX512_BF16_TARGET {
    ok = ok && WeightsBlock<kRows>(DotArgs(q, r, tile, scratch), logit_scale, w + r * n32, n32,
                                   rows + r);
  });
  if (!ok) return false;
  // A NaN logit (its weight NaN), or a row whose keys so far were all -inf:
  // SoftmaxRow's rules for them.
  float sums[kRowChunk];
  for (int64_t r = 0; r < q.rows; ++r) {
    sums[r] = _mm512_reduce_add_ps(rows[r].sum);
    if (std::isnan(sums[r])) return false;
    if (rows[r].keys > 0 && rows[r].ref == -std::numeric_limits<float>::infinity()) return false;
  }
  for (int64_t r = 0; r < q.rows; ++r) CommitRow(rows[r], sums[r], state, r);
  return true;
}

template <DType kDtype>
RPA_AVX512_BF16_TARGET void Pv(const TileLogits& p, const KvTile& tile, const SoftmaxState& state,
                        const TileScratch& scratch) {
  if (p.rows <= 0 || tile.n <= 0) return;
  const uint16_t* vp = PackedValues(tile, scratch);  // PrepareTile's.
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
    "avx512_bf16_packed", QueryFormat::kBf16,    PrepareBf16Row, AccOrder::kNatural,
    /*e4m3_scaled=*/false,  /*prepare_tile=*/PrepareTile<kDtype>,
    Logits<kDtype>,         Pv<kDtype>,
    Weights<kDtype>};

}  // namespace

const ProductKernel* Avx512Bf16Packed(DType kv_dtype) {
  return KernelForKvDtype<ProductKernel, DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2,
                          DType::kI8>(kv_dtype, []<DType kDtype>() { return &kPacked<kDtype>; });
}

}  // namespace rpa::internal

#endif  // __x86_64__
