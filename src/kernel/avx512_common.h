// Pieces the AVX-512 tile kernels share (avx512_wide.cc, avx512_fp16_decode.cc,
// avx512_bf16_rows.cc, avx512_bf16_lanes.cc, bf16_pairs.cc): the
// transpose-and-add reduction of 16 accumulators into one vector of logits,
// the 16 x 16 dword transpose, the bf16 weight rows, the fused tiles' exp,
// row reductions, logits walk and online-softmax update, the 8-bit
// conversions and the reader of a K/V row as bf16 (RowReader), the
// row-major PV pass (PvPass) and its row and chunk walks. x86-64 only;
// every function is compiled for the instructions it uses (never
// -march=native for a file) and called only where CpuFeatures says so.
#ifndef RPA_SRC_KERNEL_AVX512_COMMON_H_
#define RPA_SRC_KERNEL_AVX512_COMMON_H_

#if defined(__x86_64__)
// GCC 12's _mm512_undefined_* are written `__m512 __Y = __Y;`, which
// -Wuninitialized flags wherever they inline (GCC bug 105593). The warning
// points into immintrin.h, first included here, so ignoring it for this
// header's text (pushed here, popped at its end) covers its includers' calls
// without turning it off for their own code.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernel/exp_non_positive.h"
#include "kernel/tile_kernel.h"
#include "rpa/dtype.h"

#define RPA_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
// The bf16-pair kernels' functions: AVX-512 BF16 (vdpbf16ps, vcvtne2ps2bf16) too.
#define RPA_AVX512_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace rpa::internal::avx512 {

// The elements of the 32-element chunk at d (< size) that lie below size:
// all of a whole chunk, the tail of the last one.
inline __mmask32 ChunkMask(int64_t d, int64_t size) {
  const int64_t left = size - d;
  return left >= 32 ? ~__mmask32{0} : (__mmask32{1} << left) - 1;
}

// The first `count` of 16 lanes (none for count <= 0).
inline __mmask16 Lanes16(int64_t count) {
  return count >= 16 ? __mmask16{0xFFFF}
                     : static_cast<__mmask16>((1u << (count > 0 ? count : 0)) - 1);
}

// acc + a[2i] b[2i] + a[2i + 1] b[2i + 1] in each f32 lane i (vdpbf16ps).
RPA_AVX512_BF16_TARGET __attribute__((always_inline)) inline __m512 DotBf16(__m512 acc, __m512i a,
                                                                         __m512i b) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
}

// The 32-bit word at p (a pair of bf16, element p[0] in the low half) in
// every lane.
RPA_AVX512_TARGET __attribute__((always_inline)) inline __m512i BroadcastPair(const uint16_t* p) {
  uint32_t pair;
  std::memcpy(&pair, p, sizeof(pair));
  return _mm512_set1_epi32(static_cast<int>(pair));
}

// v[j] lane c becomes v[c] lane j (16 x 16 dwords): 32-bit and 64-bit
// unpacks within 128-bit lanes, then two rounds of 128-bit lane shuffles.
RPA_AVX512_TARGET __attribute__((always_inline)) inline void Transpose16x16(__m512i* v) {
  __m512i t[16], u[16];
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_epi32(v[2 * k], v[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_epi32(v[2 * k], v[2 * k + 1]);
  }
  // u[4 k + m], block L: rows 4 k .. 4 k + 3 of column 4 L + m.
  for (int k = 0; k < 4; ++k) {
    u[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
    u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512i w0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x88);
    const __m512i w1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xDD);
    const __m512i w2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x88);
    const __m512i w3 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xDD);
    v[m] = _mm512_shuffle_i32x4(w0, w2, 0x88);
    v[4 + m] = _mm512_shuffle_i32x4(w1, w3, 0x88);
    v[8 + m] = _mm512_shuffle_i32x4(w0, w2, 0xDD);
    v[12 + m] = _mm512_shuffle_i32x4(w1, w3, 0xDD);
  }
}

// Each row's f32 weights [0, n) of p as bf16 (nearest even) at the start of
// the same row, key n's 0 where n is odd (the weight pairs the bf16-pair PV
// multiplies): each 32-key chunk is read before its bf16, at or below it, is
// stored.
RPA_AVX512_BF16_TARGET inline void RowWeightsToBf16(const TileLogits& p, int64_t n) {
  for (int64_t r = 0; r < p.rows; ++r) {
    float* row = p.s + r * p.stride;
    uint16_t* out = reinterpret_cast<uint16_t*>(row);
    for (int64_t t = 0; t < n; t += 32) {
      const __m512 a = _mm512_maskz_loadu_ps(Lanes16(n - t), row + t);
      const __m512 b = _mm512_maskz_loadu_ps(Lanes16(n - t - 16), row + t + 16);
      const __m512i bf = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
      _mm512_mask_storeu_epi16(out + t, ChunkMask(t, RoundUp(n, 2)), bf);
    }
  }
}

// Stores a kRows x kTokens block's logits (lane r * kTokens + t) for the
// rows and tokens that exist.
template <int kRows, int kTokens>
RPA_AVX512_TARGET __attribute__((always_inline)) inline void StoreLogitsBlock(
    __m512 logits, int64_t rows, int64_t tokens, float* s, int64_t s_stride) {
  alignas(64) float sums[16];
  _mm512_store_ps(sums, logits);
  const int64_t valid_rows = rows < kRows ? rows : kRows;
  const int64_t valid_tokens = tokens < kTokens ? tokens : kTokens;
  for (int64_t r = 0; r < valid_rows; ++r) {
    std::memcpy(s + r * s_stride, sums + r * kTokens, sizeof(float) * valid_tokens);
  }
}

// x + y as 16 floats, or (kHalf) as 32 halves (vaddph).
template <bool kHalf>
RPA_AVX512_TARGET __attribute__((always_inline)) inline __m512 AddLanes(__m512 x, __m512 y) {
  if constexpr (kHalf) {
    __asm__("vaddph %1, %0, %0" : "+v"(x) : "v"(y));
    return x;
  } else {
    return _mm512_add_ps(x, y);
  }
}

// Lane i of the result = sum of the lanes of a[i] (kHalf: 32-bit lane i
// holds two halves whose sum is that of a[i]'s 32 halves).
// always_inline: called out of line, the accumulator array's address escapes
// and GCC stores all 16 accumulators to the stack on every step.
template <bool kHalf = false>
RPA_AVX512_TARGET __attribute__((always_inline)) inline __m512 SumEach16(const __m512* a) {
  __m512 b[8];
  for (int i = 0; i < 8; ++i) {
    const __m512 x = a[2 * i], y = a[2 * i + 1];
    b[i] = AddLanes<kHalf>(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
  }
  __m512 c[4];
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
    c[i] = AddLanes<kHalf>(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                           _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // c[i] holds, in each 128-bit lane L, the lane-L partial sums of
  // a[4i .. 4i+3]; add the four 128-bit lanes of each c[i].
  const __m512 e01 =
      AddLanes<kHalf>(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(1, 0, 1, 0)),
                      _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 e23 =
      AddLanes<kHalf>(_mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(1, 0, 1, 0)),
                      _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return AddLanes<kHalf>(_mm512_shuffle_f32x4(e01, e23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(e01, e23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Lane i of the result = the sum of acc[i]'s lanes (kHalf: 32 halves each),
// as f32: a block's 16 logits.
template <bool kHalf = false>
RPA_AVX512_TARGET __attribute__((always_inline)) inline __m512 BlockLogits(const __m512* acc) {
  // A copy for the reduction: acc's own address never escapes, so GCC keeps
  // it in registers instead of storing all 16 to the stack every step.
  __m512 fin[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) fin[i] = acc[i];
  if constexpr (kHalf) {
    const __m512i pairs = _mm512_castps_si512(SumEach16<true>(fin));
    // Lane i's two halves added, the sum in the low half, then as f32.
    const __m512 sums = AddLanes<true>(_mm512_castsi512_ps(pairs),
                                       _mm512_castsi512_ps(_mm512_srli_epi32(pairs, 16)));
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_castps_si512(sums)));
  } else {
    return SumEach16(fin);
  }
}


// e^x for x <= 0, -inf included (exp_non_positive.h: the method, its error
// and why Estrin's form).
RPA_AVX512_TARGET __attribute__((always_inline)) inline __m512 ExpNonPositive(__m512 x) {
  namespace e = exp_non_positive;
  const __m512 lowest = _mm512_set1_ps(e::kLowest);
  // Lanes below kLowest (-inf included) come out 0 by the zero-masking of the
  // last step; what they compute before it (NaN from -inf) is never seen.
  const __mmask16 normal = _mm512_cmp_ps_mask(x, lowest, _CMP_GE_OQ);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(e::kLog2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(e::kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(e::kLn2Lo), r);
  const auto pair = [r](int k) RPA_AVX512_TARGET {  // t_k + t_{k+1} r
    return _mm512_fmadd_ps(r, _mm512_set1_ps(e::kTaylor[k + 1]), _mm512_set1_ps(e::kTaylor[k]));
  };
  const __m512 r2 = _mm512_mul_ps(r, r);
  const __m512 low = _mm512_fmadd_ps(r2, pair(2), pair(0));
  const __m512 high = _mm512_fmadd_ps(r2, pair(6), pair(4));
  const __m512 poly = _mm512_fmadd_ps(_mm512_mul_ps(r2, r2), high, low);
  return _mm512_maskz_scalef_ps(normal, poly, n);
}

// Lane i of the result: the sum (or max) of the four lanes of v's 128-bit
// lane that holds i, i.e. of row i / 4 in a logits block.
RPA_AVX512_TARGET __attribute__((always_inline)) inline __m512 RowMax(__m512 v) {
  v = _mm512_max_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_max_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
}
RPA_AVX512_TARGET __attribute__((always_inline)) inline __m512 RowSum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
}
// Lane r (< 4) of the result: lane 4r of v, one per row.
RPA_AVX512_TARGET __attribute__((always_inline)) inline __m128 PerRow(__m512 v) {
  return _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), v));
}

// A fused decode tile's logits, 4 keys at a time: block(k) gives the scaled
// logits of keys k[0..3] (lane r * 4 + t); they go to w, keys past n as
// -inf, for DecodeTileSoftmax, with their lane-wise maximum in *vmax and
// the lanes that were NaN in *nan. The next tile's K rows are prefetched
// meanwhile.
template <class Block>
RPA_AVX512_TARGET __attribute__((always_inline)) inline void DecodeTileLogits(
    const KvTile& tile, const Block& block, float* w, __m512* vmax, __mmask16* nan) {
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  *vmax = neg_inf;
  *nan = 0;
  const int64_t n = tile.n;
  for (int64_t b = 0; 4 * b < n; ++b) {
    const int64_t t0 = 4 * b, valid = n - t0 < 4 ? n - t0 : 4;
    PrefetchRows(tile.k_next, t0, 4, tile.row_bytes);
    const void* k[4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) k[t] = tile.k[t0 + (t < valid ? t : 0)];
    __m512 x = block(k);
    *nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __mmask16 keys = static_cast<__mmask16>(((1u << valid) - 1) * 0x1111u);
    x = _mm512_mask_blend_ps(keys, neg_inf, x);
    *vmax = _mm512_max_ps(*vmax, x);
    _mm512_store_ps(w + 16 * b, x);
  }
}

// Whether a fused tile's online-softmax update follows the reference on the
// lanes `lanes`: no NaN logit there (nan), no NaN running maximum (m_old), a
// finite new maximum (m_new). Otherwise the tile declines, and SoftmaxRow's
// rules take the rows.
RPA_AVX512_TARGET __attribute__((always_inline)) inline bool FusedSoftmaxFollows(
    __mmask16 nan, __m512 m_old, __m512 m_new, __mmask16 lanes) {
  const __mmask16 finite = _mm512_mask_cmp_ps_mask(lanes, _mm512_sub_ps(m_new, m_new),
                                                   _mm512_setzero_ps(), _CMP_EQ_OQ);
  return (nan & lanes) == 0 && finite == lanes &&
         _mm512_mask_cmp_ps_mask(lanes, m_old, m_old, _CMP_UNORD_Q) == 0;
}

// A fused decode tile's new softmax state for its (up to) 4 rows: m, l and
// the factor alpha = e^(m_old - m_new) that rescales the old accumulator.
struct DecodeTileState {
  alignas(16) float m[4], l[4], alpha[4];
  void Commit(int64_t rows, float* m_out, float* l_out) const {
    std::memcpy(m_out, m, sizeof(float) * rows);
    std::memcpy(l_out, l, sizeof(float) * rows);
  }
};

// The online-softmax update of a fused decode tile. w holds the tile's
// scaled logits in blocks of 16 (lane r * 4 + t; -inf where a block has no
// key t), vmax their lane-wise maximum, nan the lanes that were NaN. On
// success w holds the weights e^(s - m_new) and *next the rows' new state;
// false, with nothing written, where a NaN (here or in m) or a row maximum
// that is not finite needs SoftmaxRow's rules.
RPA_AVX512_TARGET __attribute__((always_inline)) inline bool DecodeTileSoftmax(
    float* w, int64_t n, __m512 vmax, __mmask16 nan, int64_t rows, const float* m,
    const float* l, DecodeTileState* next) {
  const __mmask8 row_mask = static_cast<__mmask8>((1u << rows) - 1);
  const __mmask16 row_lanes = static_cast<__mmask16>((1u << (4 * rows)) - 1);
  const __m512 m_old = _mm512_permutexvar_ps(
      _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
      _mm512_castps128_ps512(_mm_maskz_loadu_ps(row_mask, m)));
  const __m512 m_new = _mm512_max_ps(m_old, RowMax(vmax));
  if (!FusedSoftmaxFollows(nan, m_old, m_new, row_lanes)) return false;
  const __m512 alpha = ExpNonPositive(_mm512_sub_ps(m_old, m_new));  // m_old = -inf: 0.
  __m512 sum = _mm512_setzero_ps();
  for (int64_t b = 0; 4 * b < n; ++b) {
    const __m512 p = ExpNonPositive(_mm512_sub_ps(_mm512_load_ps(w + 16 * b), m_new));
    sum = _mm512_add_ps(sum, p);
    _mm512_store_ps(w + 16 * b, p);
  }
  const __m128 alpha_rows = PerRow(alpha);
  _mm_store_ps(next->alpha, alpha_rows);
  _mm_store_ps(next->m, PerRow(m_new));
  const __m128 l_old = _mm_maskz_loadu_ps(row_mask, l);
  _mm_store_ps(next->l, _mm_add_ps(_mm_mul_ps(l_old, alpha_rows), PerRow(RowSum(sum))));
  return true;
}

// The logits of every row and key of a tile in blocks of 16 logits: 4 rows x
// 4 keys, or for the last 1-2 rows 2 x 8 / 1 x 16, so that 1-2 q heads per
// kv head still fill 16 accumulators. block.template operator()<kRows,
// kTokens>(r, t) computes rows [r, r + kRows) x keys [t, t + kTokens). The
// first row block prefetches the next tile's K rows, a block's worth per
// block (and up front those past this tile's keys).
template <class Block>
__attribute__((always_inline)) inline void ForEachLogitsBlock(int64_t rows, const KvTile& tile,
                                                              const Block& block) {
  const int64_t n = tile.n, bytes = tile.row_bytes;
  const int64_t per = rows > 2 ? 4 : rows == 2 ? 8 : 16;
  if (tile.k_next.count > RoundUp(n, per)) {
    PrefetchRows(tile.k_next, RoundUp(n, per), tile.k_next.count, bytes);
  }
  // Keys outside, row blocks inside: a block's 4 K rows are read from L2 once
  // for all row blocks (a tile's rows are a token, 4 KiB, apart: they share
  // L1 sets and do not stay there from one row block's pass to the next).
  // The rows the 4-row blocks cover (a last block of 3 rows included).
  const int64_t four_row_span = rows % 4 > 2 ? RoundUp(rows, 4) : rows / 4 * 4;
  for (int64_t t = 0; four_row_span > 0 && t < n; t += 4) {
    PrefetchRows(tile.k_next, t, 4, bytes);
    for (int64_t r = 0; r < four_row_span; r += 4) block.template operator()<4, 4>(r, t);
  }
  const int64_t r = four_row_span;
  if (rows - r == 2) {
    for (int64_t t = 0; t < n; t += 8) {
      if (r == 0) PrefetchRows(tile.k_next, t, 8, bytes);
      block.template operator()<2, 8>(r, t);
    }
  } else if (rows - r == 1) {
    for (int64_t t = 0; t < n; t += 16) {
      if (r == 0) PrefetchRows(tile.k_next, t, 16, bytes);
      block.template operator()<1, 16>(r, t);
    }
  }
}

// PV of every row in blocks of 4, 2 and 1 rows: pass.template
// operator()<kRows>(r, first) runs rows [r, r + kRows); `first` (the first
// block) issues the next tile's V prefetches.
template <class Pass>
__attribute__((always_inline)) inline void ForEachPvRowBlock(int64_t rows, const Pass& pass) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) pass.template operator()<4>(r, r == 0);
  if (rows - r >= 2) {
    pass.template operator()<2>(r, r == 0);
    r += 2;
  }
  if (rows - r == 1) pass.template operator()<1>(r, r == 0);
}

// One PV pass of the row-major kernels (avx512_wide.cc: f32 weights,
// avx512_bf16_rows.cc: bf16 ones) over a tile's V rows: accumulator rows
// (in the kernel's AccOrder) += sum_t p[r][t] v_t.
template <class Weight>
struct PvPass {
  const Weight* w = nullptr;  // Row r's weights at w + r * w_stride (or the fused tile's blocks).
  int64_t w_stride = 0;       // Elements between rows.
  int64_t rows = 0;           // Valid rows (of the block's kRows).
  KvRows v;                   // [n] V rows.
  int64_t n = 0;
  int64_t head_dim = 0;
  float* acc = nullptr;  // [rows, acc_stride]
  int64_t acc_stride = 0;
  const float* alpha = nullptr;      // [rows] scales each acc row first; null: none.
  const KvRows* prefetch = nullptr;  // The next tile's V rows; null: none.
  int64_t prefetch_bytes = 0;
};

// A pass over the tile's V rows into the state's accumulators, prefetching
// the next tile's; the weights, rows and alpha are the caller's.
template <class Weight>
PvPass<Weight> PvPassOver(const KvTile& tile, const SoftmaxState& state) {
  PvPass<Weight> a;
  a.v = tile.v;
  a.n = tile.n;
  a.head_dim = tile.head_dim;
  a.acc = state.acc;
  a.acc_stride = state.stride;
  a.prefetch = tile.v_next.count > 0 ? &tile.v_next : nullptr;
  a.prefetch_bytes = tile.row_bytes;
  return a;
}

// One row block's PV over the whole head: block.template
// operator()<kChunks>(d0, first) on pairs of 32-dim chunks, then on a last
// single chunk where the chunk count is odd; the first pass (d0 = 0)
// issues the prefetches.
template <class Block>
__attribute__((always_inline)) inline void ForEachPvChunks(int64_t head_dim, const Block& block) {
  int64_t d = 0;
  for (; d + 32 < head_dim; d += 64) block.template operator()<2>(d, d == 0);
  if (d < head_dim) block.template operator()<1>(d, d == 0);
}

// PV of a's rows in blocks of 4, 2 and 1 rows: run.template
// operator()<kRows>(block) runs each block's pass; the first block
// prefetches the next tile's V rows (those past this tile's n first).
template <class Weight, class Run>
__attribute__((always_inline)) inline void PvAllRows(const PvPass<Weight>& a, int64_t rows,
                                                     const Run& run) {
  const KvRows* pf = a.prefetch;
  if (pf != nullptr && pf->count > a.n) PrefetchRows(*pf, a.n, pf->count, a.prefetch_bytes);
  ForEachPvRowBlock(rows, [&]<int kRows>(int64_t r, bool first) {
    PvPass<Weight> block = a;
    block.w = a.w + r * a.w_stride;
    block.acc = a.acc + r * a.acc_stride;
    block.rows = kRows;
    block.prefetch = first ? pf : nullptr;
    run.template operator()<kRows>(block);
  });
}

// A fused decode tile's first half: the scaled logits of 4 rows x the
// tile's keys (block(k): keys k[0..3], lane r * 4 + t) into w, then the
// online-softmax update (DecodeTileSoftmax); commits m and l and returns
// true, or returns false with the state untouched.
template <class Block>
RPA_AVX512_TARGET __attribute__((always_inline)) inline bool DecodeTileWeights(
    const KvTile& tile, int64_t rows, const Block& block, const SoftmaxState& state, float* w,
    DecodeTileState* next) {
  __m512 vmax;
  __mmask16 nan;
  DecodeTileLogits(tile, block, w, &vmax, &nan);
  if (!DecodeTileSoftmax(w, tile.n, vmax, nan, rows, state.m, state.l, next)) return false;
  next->Commit(rows, state.m, state.l);
  return true;
}

// The 4 query rows of a fused tile: rows past q.rows repeat the last one
// (nothing of theirs is stored).
template <class T>
inline void FusedQueryRows(const QueryRows& q, const T* (&rows)[4]) {
  const T* q0 = static_cast<const T*>(q.data);
  for (int r = 0; r < 4; ++r) rows[r] = q0 + (r < q.rows ? r : q.rows - 1) * q.stride;
}

// 8-bit floats to bf16 by table lookup, 32 codes at a time, for every
// AVX-512 kernel that reads them (the widening kernels, the AMX packs).
// Bits of the bf16 value of each 8-bit float magnitude (code & 0x7F), e4m3fn
// times 2^-8 (kE4M3Rescale) where e4m3_scaled; exact either way.
struct Fp8Table {
  alignas(64) uint16_t bits[128];
};

inline Fp8Table MakeFp8Table(DType dtype, bool e4m3_scaled) {
  Fp8Table t;
  for (int code = 0; code < 128; ++code) {
    const uint8_t byte = static_cast<uint8_t>(code);
    float f = LoadAsF32(dtype, &byte, 0);
    if (dtype == DType::kF8E4M3FN && e4m3_scaled) f *= 1.0f / kE4M3Rescale;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    // Exact in bf16 (low half zero); NaN stays a quiet NaN.
    t.bits[code] = f != f ? uint16_t{0x7FC0} : static_cast<uint16_t>(u >> 16);
  }
  return t;
}

// The table of an 8-bit float K/V dtype, or null for any other dtype.
inline const Fp8Table* Fp8TableOf(DType dtype, bool e4m3_scaled) {
  static const Fp8Table e4m3 = MakeFp8Table(DType::kF8E4M3FN, false);
  static const Fp8Table e4m3_times_2_pow_minus_8 = MakeFp8Table(DType::kF8E4M3FN, true);
  static const Fp8Table e5m2 = MakeFp8Table(DType::kF8E5M2, false);
  if (dtype == DType::kF8E4M3FN) return e4m3_scaled ? &e4m3_times_2_pow_minus_8 : &e4m3;
  if (dtype == DType::kF8E5M2) return &e5m2;
  return nullptr;
}

// The table in four registers, for converting in the loops.
struct Fp8Lut {
  __m512i t0, t1, t2, t3;
};

RPA_AVX512_TARGET __attribute__((always_inline)) inline Fp8Lut LoadLut(const Fp8Table* table) {
  Fp8Lut lut;
  if (table == nullptr) {
    lut.t0 = lut.t1 = lut.t2 = lut.t3 = _mm512_setzero_si512();
  } else {
    lut.t0 = _mm512_load_si512(table->bits);
    lut.t1 = _mm512_load_si512(table->bits + 32);
    lut.t2 = _mm512_load_si512(table->bits + 64);
    lut.t3 = _mm512_load_si512(table->bits + 96);
  }
  return lut;
}

// The bf16 bits of 32 8-bit float codes (zero-extended to 16 bits, x).
RPA_AVX512_TARGET __attribute__((always_inline)) inline __m512i Fp8ToBf16(__m512i x,
                                                                         const Fp8Lut& lut) {
  // permutex2var reads index bits [5:0]: entries 0-63 from (t0, t1),
  // 64-127 from (t2, t3); bit 6 picks between them.
  const __m512i lo = _mm512_permutex2var_epi16(lut.t0, x, lut.t1);
  const __m512i hi = _mm512_permutex2var_epi16(lut.t2, x, lut.t3);
  const __m512i mag =
      _mm512_mask_blend_epi16(_mm512_test_epi16_mask(x, _mm512_set1_epi16(0x40)), lo, hi);
  // mag | (x << 8 & 0x8000): the sign bit back on top.
  return _mm512_ternarylogic_epi32(mag, _mm512_slli_epi16(x, 8),
                                   _mm512_set1_epi16(static_cast<short>(0x8000)), 0xF8);
}

// The bf16 bits of 32 int8 values (exact: |x| <= 128 needs 8 significant
// bits, bf16 has 8): sign-extended and converted through f32.
RPA_AVX512_BF16_TARGET __attribute__((always_inline)) inline __m512i I8ToBf16(__m256i x) {
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(x)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(x, 1)));
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

// Reads a K/V row of kDtype (bf16, fp8 e4m3fn or e5m2, int8) as bf16, 32
// elements at a time, exactly: 8-bit floats by their table (e4m3fn at its
// true value, NaN codes stay NaN), int8 through f32. Masked loads read
// nothing past the row (its tail reads as 0). Every bf16-pair kernel's
// reader (avx512_bf16_rows.cc, avx512_bf16_lanes.cc, bf16_pairs.cc).
template <DType kDtype>
struct RowReader {
  static_assert(kDtype == DType::kBF16 || kDtype == DType::kF8E4M3FN ||
                kDtype == DType::kF8E5M2 || kDtype == DType::kI8);
  Fp8Lut lut;  // 8-bit floats: the table in registers (unused otherwise).
  int64_t head_dim;

  RPA_AVX512_TARGET explicit RowReader(int64_t dim)
      : lut(LoadLut(Fp8TableOf(kDtype, /*e4m3_scaled=*/false))), head_dim(dim) {}

  // Elements [d0, d0 + 32) of the row under mask (0 outside it); kWhole:
  // all 32 by unmasked loads (the caller knows d0 + 32 <= head_dim).
  template <bool kWhole = false>
  RPA_AVX512_BF16_TARGET __attribute__((always_inline)) inline __m512i Chunk(
      const void* row, int64_t d0, __mmask32 mask) const {
    if constexpr (kDtype == DType::kBF16) {
      const uint16_t* p = static_cast<const uint16_t*>(row) + d0;
      return kWhole ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(mask, p);
    } else {
      const uint8_t* p = static_cast<const uint8_t*>(row) + d0;
      const __m256i codes = kWhole ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                   : _mm256_maskz_loadu_epi8(mask, p);
      if constexpr (kDtype == DType::kI8) return I8ToBf16(codes);
      return Fp8ToBf16(_mm512_cvtepu8_epi16(codes), lut);
    }
  }

  // Elements [d0, d0 + 32), 0 past head_dim (d0 < head_dim).
  RPA_AVX512_BF16_TARGET __attribute__((always_inline)) inline __m512i operator()(
      const void* row, int64_t d0) const {
    return Chunk(row, d0, ChunkMask(d0, head_dim));
  }
};

}  // namespace rpa::internal::avx512

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // __x86_64__
#endif  // RPA_SRC_KERNEL_AVX512_COMMON_H_
