// The softmax fused into a bf16-pair kernel's logits (ProductKernel::
// weights) of avx512_bf16_packed and amx_prefill: each block of up to 8 rows
// x 32 keys of logits becomes bf16 weights in registers, in PV's layout
// ([rows][RoundUp(n, 32)] bf16), against a lazy per-row reference
// (docs/kernel.md). The logits come from a Source: the packed kernel's
// vdpbf16ps products in registers, or AMX's tiles stored to memory.
//
// A Source has template <int kRows> void Dots(int64_t r, int64_t j0, __m512*
// t0, __m512* t1) const: rows [r, r + kRows)'s products q . k for keys [j0,
// j0 + 16) in t0[i], [j0 + 16, j0 + 32) in t1[i] (any value for keys a row
// does not see). x86-64 only; call where the CPU has AVX-512 BF16.
#ifndef RPA_SRC_KERNEL_LAZY_SOFTMAX_BF16_H_
#define RPA_SRC_KERNEL_LAZY_SOFTMAX_BF16_H_

#if defined(__x86_64__)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernel/avx512_common.h"
#include "kernel/softmax_finish.h"
#include "kernel/tile_kernel.h"

namespace rpa::internal::lazy_softmax {

using avx512::Lanes16;

// Rows of a block: 8 rows x 2 vectors of 16 keys (or dims) in registers.
inline constexpr int kBlockRows = 8;

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

// The fused softmax's reference for a row's weights may trail its largest
// logit by up to ln 256 (weights up to 2^kLazyLag2 = 256, far inside f32's
// range): a block of keys raises it only when one of its logits passes it
// by more, so most blocks skip the horizontal maximum. Any reference gives
// the same softmax: m and l stay relative to it (FinishRow and the split
// merges need them consistent, not m the maximum).
inline constexpr float kLazyLag2 = 8.0f;  // In log2 units, as WeightsBlock's t.

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
RPA_AVX512_BF16_TARGET inline void RescaleWeights(uint16_t* w, int64_t j0, float a) {
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

// Rows [first, first + kRows), per 32-key block: the products (the source's
// Dots), then in registers t = (logit - reference) log2 e, the references
// raised where a t passes the lag (one test per block), 2^t for the keys
// each row sees (0 past them) summed into the row's sum and stored as bf16
// at w + i * w_stride for row first + i. A NaN logit makes the sum NaN (Exp2
// keeps it); false: a +inf or NaN logit where a reference was set or raised.
template <int kRows, class Source>
RPA_AVX512_BF16_TARGET bool WeightsBlock(const Source& source, int64_t first, float logit_scale,
                                         uint16_t* w, int64_t w_stride, LazyRow* rows) {
  constexpr float kLog2E = 1.44269504f;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  int64_t keys = 0;
  for (int r = 0; r < kRows; ++r) keys = std::max(keys, rows[r].keys);
  const __m512 scale = _mm512_set1_ps(logit_scale);
  const __m512 scale_log2e = _mm512_set1_ps(logit_scale * kLog2E);
  for (int64_t j0 = 0; j0 < keys; j0 += 32) {
    __m512 t0[kRows], t1[kRows];  // The dots, then t.
    source.template Dots<kRows>(first, j0, t0, t1);
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
RPA_AVX512_BF16_TARGET inline void CommitRow(const LazyRow& row, float sum,
                                             const SoftmaxState& state, int64_t r) {
  if (row.keys <= 0) return;  // The row sees no key of the tile.
  const float alpha = MoveToReference(row.ref, sum, state.m + r, state.l + r);
  if (alpha == 1.0f) return;
  float* acc = state.acc + r * state.stride;
  for (int64_t d = 0; d < state.stride; d += 16) {
    _mm512_storeu_ps(acc + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), _mm512_set1_ps(alpha)));
  }
}

// ProductKernel::weights for rows [0, rows) (at most kRowChunk) of a tile
// of n keys: WeightsBlock over the rows' blocks, the bf16 weights at s.s
// ([rows][RoundUp(n, 32)]), every row's written up to the 32-key block
// that ends the rows' KeysNeeded (zero past each row's own keys: a block's
// rows past the keys any of them needs are zeroed, as AMX's 16-row PV tiles
// read them), then, if none declined and every row that sees a key has a
// finite reference, the commits. False, with no state touched: the task
// loop's softmax takes the rows.
template <class Source>
RPA_AVX512_BF16_TARGET bool Weights(const Source& source, int64_t rows, int64_t n,
                                    const TileLogits& s, float logit_scale,
                                    const SoftmaxState& state) {
  if (rows > kRowChunk) return false;
  if (rows <= 0 || n <= 0) return true;
  LazyRow lazy[kRowChunk];
  for (int64_t r = 0; r < rows; ++r) {
    if (std::isnan(state.m[r])) return false;  // A poisoned row: SoftmaxRow's.
    lazy[r] = {state.m[r], _mm512_setzero_ps(), s.needed != nullptr ? s.needed[r] : n};
  }
  auto round_up32 = [](int64_t keys) { return (keys + 31) / 32 * 32; };
  const int64_t n32 = round_up32(n);
  const int64_t all_keys = round_up32(KeysNeeded(s, 0, rows, n));
  uint16_t* w = reinterpret_cast<uint16_t*>(s.s);
  bool ok = true;
  ForEachRowBlock(rows, [&]<int kRows>(int64_t r) RPA_AVX512_BF16_TARGET {
    ok = ok && WeightsBlock<kRows>(source, r, logit_scale, w + r * n32, n32, lazy + r);
    const int64_t written = round_up32(KeysNeeded(s, r, kRows, n));
    for (int64_t i = r; ok && i < r + kRows; ++i) {
      std::memset(w + i * n32 + written, 0, sizeof(uint16_t) * (all_keys - written));
    }
  });
  if (!ok) return false;
  // A NaN logit (its weight NaN), or a row whose keys so far were all -inf:
  // SoftmaxRow's rules for them.
  float sums[kRowChunk];
  for (int64_t r = 0; r < rows; ++r) {
    sums[r] = _mm512_reduce_add_ps(lazy[r].sum);
    if (std::isnan(sums[r])) return false;
    if (lazy[r].keys > 0 && lazy[r].ref == -std::numeric_limits<float>::infinity()) return false;
  }
  for (int64_t r = 0; r < rows; ++r) CommitRow(lazy[r], sums[r], state, r);
  return true;
}

}  // namespace rpa::internal::lazy_softmax

#endif  // __x86_64__
#endif  // RPA_SRC_KERNEL_LAZY_SOFTMAX_BF16_H_
