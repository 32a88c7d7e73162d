// The AVX-512 widening kernels: bf16, f16, 8-bit float (e4m3fn, e5m2) and
// int8 K/V widened to f32 in registers, products by f32 FMA (AVX-512
// F/BW/VL).
//
// Arithmetic: a 32-bit lane of 32 loaded bf16 holds elements 2i (low half)
// and 2i + 1 (high half); a shift and a mask turn them into two f32 vectors,
// the even and the odd elements of the chunk, with no shuffle. q rows are
// stored in the same even/odd order (kF32EvenOdd, WideQIndex), so a dot
// product needs nothing else, and PV accumulates in that order (kEvenOdd),
// which the task loop undoes once per task. 8-bit floats become bf16 by two
// vpermi2w table lookups per 32 codes (exact; e4m3fn as value * 2^-8); f16
// is gathered into its even and odd halves by one vpermw and widened by
// vcvtph2ps (exact); int8 is sign-extended to words, whose halves become
// the even and odd elements by two shifts (exact).
//
// Shapes: logits of blocks of 4 rows x 4 keys (2 x 8, 1 x 16 for fewer rows,
// so 1-2 q heads per kv head still fill 16 accumulators) reduced by one
// transpose-and-add tree; PV over 4 rows x 64 dims per pass.
//
// Dispatch chooses it for bf16, f16, 8-bit float and int8 K/V with fewer than
// kPackedMinRows rows per kv head where the CPU has AVX-512 BW (vdpbf16ps
// issues at half the FMA rate on the CPUs measured, docs/kernel.md), and
// its fused tile (kAvx512WideDecode) for decode tiles of 3-8 rows.
#include "kernel/avx512_wide.h"

#if defined(__x86_64__)
#include <cstring>

#include "kernel/avx512_common.h"
#include "rpa/dtype.h"

namespace rpa::internal {
namespace avx512 {
namespace {

RPA_AVX512_TARGET void Fp8RowsToBf16Impl(const Fp8Table& table, const KvRows& rows, int64_t n,
                                         int64_t head_dim, const TileScratch& scratch) {
  const Fp8Lut lut = LoadLut(&table);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = static_cast<const uint8_t*>(rows[i]);
    uint16_t* out = scratch.kv_bf16 + i * scratch.dim_pad;
    for (int64_t d = 0; d < head_dim; d += 32) {
      const __m512i x =
          _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(ChunkMask(d, head_dim), src + d));
      _mm512_storeu_si512(out + d, Fp8ToBf16(x, lut));
    }
    scratch.converted[i] = reinterpret_cast<const uint8_t*>(out);
  }
}

// How a K/V row's elements are stored.
enum class Code : uint8_t {
  kBf16,  // bf16: each 32-bit lane's halves are the even and odd element.
  kFp8,   // e4m3fn or e5m2: a table lookup to bf16 first (Fp8ToBf16).
  kF16,   // f16: even and odd halves gathered by one vpermw, then vcvtph2ps.
  kI8,    // int8: sign-extended to words, each 32-bit lane's halves shifted out.
};

RPA_AVX512_TARGET __attribute__((always_inline)) inline void Widen(__m512i raw, __m512* even,
                                                                   __m512* odd) {
  *even = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
  *odd = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(-65536)));
}

// Elements [d, d + 32) of a K/V row (masked: nothing past the row is read,
// the tail is 0) as f32, even elements in *even and odd ones in *odd. 8-bit
// floats and f16 are converted in registers, so no scratch row is written
// and read back; every conversion is exact.
template <Code kCode>
RPA_AVX512_TARGET __attribute__((always_inline)) inline void LoadWide(const void* row, int64_t d,
                                                                      __mmask32 mask,
                                                                      const Fp8Lut& lut,
                                                                      __m512* even, __m512* odd) {
  if constexpr (kCode == Code::kFp8) {
    const __m512i x = _mm512_cvtepu8_epi16(
        _mm256_maskz_loadu_epi8(mask, static_cast<const uint8_t*>(row) + d));
    Widen(Fp8ToBf16(x, lut), even, odd);
  } else if constexpr (kCode == Code::kI8) {
    const __m512i x = _mm512_cvtepi8_epi16(
        _mm256_maskz_loadu_epi8(mask, static_cast<const int8_t*>(row) + d));
    *even = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(x, 16), 16));
    *odd = _mm512_cvtepi32_ps(_mm512_srai_epi32(x, 16));
  } else if constexpr (kCode == Code::kF16) {
    const __m512i x = _mm512_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(row) + d);
    // Word 2i of the chunk to word i, word 2i + 1 to word 16 + i.
    const __m512i even_then_odd = _mm512_set_epi16(
        31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1,
        30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i g = _mm512_permutexvar_epi16(even_then_odd, x);
    *even = _mm512_cvtph_ps(_mm512_castsi512_si256(g));
    *odd = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(g, 1));
  } else {
    Widen(_mm512_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(row) + d), even, odd);
  }
}

// The logits of a kRows x kTokens block (kRows * kTokens = 16) of key rows
// k[t]: lane r * kTokens + t of the result is q_r . k_t.
template <int kRows, int kTokens, Code kCode>
RPA_AVX512_TARGET __attribute__((always_inline)) inline __m512 WideLogitsVector(
    const float* const* q, const void* const* k, int64_t head_dim, const Fp8Lut& lut) {
  static_assert(kRows * kTokens == 16);
  __m512 acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; d += 32) {
    const __mmask32 mask = ChunkMask(d, head_dim);
    __m512 ke[kTokens], ko[kTokens];
#pragma GCC unroll 16
    for (int t = 0; t < kTokens; ++t) LoadWide<kCode>(k[t], d, mask, lut, &ke[t], &ko[t]);
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      const __m512 qe = _mm512_loadu_ps(q[r] + d);
      const __m512 qo = _mm512_loadu_ps(q[r] + d + 16);
#pragma GCC unroll 16
      for (int t = 0; t < kTokens; ++t) {
        acc[r * kTokens + t] = _mm512_fmadd_ps(qe, ke[t], acc[r * kTokens + t]);
        acc[r * kTokens + t] = _mm512_fmadd_ps(qo, ko[t], acc[r * kTokens + t]);
      }
    }
  }
  return BlockLogits(acc);
}

// The logits of rows [r, r + kRows) x keys [t, t + kTokens) that exist.
template <int kRows, int kTokens, Code kCode>
RPA_AVX512_TARGET void WideLogitsBlock(const QueryRows& q, const KvRows& k, const KvTile& tile,
                                       int64_t r, int64_t t, const TileLogits& s,
                                       const Fp8Table* table) {
  const Fp8Lut lut = LoadLut(kCode == Code::kFp8 ? table : nullptr);
  const void* keys[kTokens];
#pragma GCC unroll 16
  for (int i = 0; i < kTokens; ++i) keys[i] = k[t + i < tile.n ? t + i : t];
  const float* q_rows[kRows];
  const float* q0 = static_cast<const float*>(q.data) + r * q.stride;
#pragma GCC unroll 16
  for (int i = 0; i < kRows; ++i) q_rows[i] = q0 + i * q.stride;
  StoreLogitsBlock<kRows, kTokens>(
      WideLogitsVector<kRows, kTokens, kCode>(q_rows, keys, tile.head_dim, lut), q.rows - r,
      tile.n - t, s.s + r * s.stride + t, s.stride);
}

// Logits of every row and key (ForEachLogitsBlock's shapes and prefetches).
template <Code kCode>
void WideLogitsRows(const QueryRows& q, const KvRows& k, const KvTile& tile, const TileLogits& s,
                    const Fp8Table* table) {
  ForEachLogitsBlock(q.rows, tile, [&]<int kRows, int kTokens>(int64_t r, int64_t t) {
    WideLogitsBlock<kRows, kTokens, kCode>(q, k, tile, r, t, s, table);
  });
}

// A PV pass (accumulators in even/odd order) on f32 weights.
using WidePvPass = PvPass<float>;

// A pass over kRows rows and the kChunks 32-dim chunks from d0: 2 chunks
// give 4 * kRows independent accumulator chains per key, enough to hide the
// FMA latency at 4 rows. With kBlocked (4 rows) p[r][t] is lane r * 4 + t % 4
// of block t / 4 (16 floats each), the fused decode tile's order.
template <int kRows, int kChunks, Code kCode, bool kBlocked>
RPA_AVX512_TARGET void WidePvBlock(const WidePvPass& a, const Fp8Table* table, int64_t d0,
                                   bool prefetch) {
  static_assert(!kBlocked || kRows == 4);
  const Fp8Lut lut = LoadLut(kCode == Code::kFp8 ? table : nullptr);
  const float* p = a.w;
  const int64_t p_stride = a.w_stride, valid_rows = a.rows, tokens = a.n;
  const int64_t acc_stride = a.acc_stride, head_dim = a.head_dim;
  float* acc = a.acc;
  const KvRows v_rows = a.v;
  const KvRows pf = prefetch && a.prefetch != nullptr ? *a.prefetch : KvRows{};
  __mmask32 mask[kChunks];
  for (int c = 0; c < kChunks; ++c) mask[c] = ChunkMask(d0 + 32 * c, head_dim);
  __m512 ae[kChunks][kRows], ao[kChunks][kRows];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    const int64_t rr = r < valid_rows ? r : 0;
#pragma GCC unroll 2
    for (int c = 0; c < kChunks; ++c) {
      ae[c][r] = _mm512_loadu_ps(acc + rr * acc_stride + d0 + 32 * c);
      ao[c][r] = _mm512_loadu_ps(acc + rr * acc_stride + d0 + 32 * c + 16);
      if (a.alpha != nullptr) {
        ae[c][r] = _mm512_mul_ps(ae[c][r], _mm512_set1_ps(a.alpha[rr]));
        ao[c][r] = _mm512_mul_ps(ao[c][r], _mm512_set1_ps(a.alpha[rr]));
      }
    }
  }
  for (int64_t t = 0; t < tokens; ++t) {
    PrefetchRows(pf, t, 1, a.prefetch_bytes);
    __m512 ve[kChunks], vo[kChunks];
#pragma GCC unroll 2
    for (int c = 0; c < kChunks; ++c) {
      LoadWide<kCode>(v_rows[t], d0 + 32 * c, mask[c], lut, &ve[c], &vo[c]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const int64_t rr = r < valid_rows ? r : 0;
      const __m512 w = _mm512_set1_ps(kBlocked ? p[(t >> 2) * 16 + rr * 4 + (t & 3)]
                                               : p[rr * p_stride + t]);
#pragma GCC unroll 2
      for (int c = 0; c < kChunks; ++c) {
        ae[c][r] = _mm512_fmadd_ps(w, ve[c], ae[c][r]);
        ao[c][r] = _mm512_fmadd_ps(w, vo[c], ao[c][r]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    if (r >= valid_rows) continue;
#pragma GCC unroll 2
    for (int c = 0; c < kChunks; ++c) {
      _mm512_storeu_ps(acc + r * acc_stride + d0 + 32 * c, ae[c][r]);
      _mm512_storeu_ps(acc + r * acc_stride + d0 + 32 * c + 16, ao[c][r]);
    }
  }
}

// One row block's PV over the whole head (ForEachPvChunks); table: 8-bit
// K/V's (kFp8), else unused.
template <int kRows, Code kCode, bool kBlocked = false>
void WidePvRows(const WidePvPass& a, const Fp8Table* table) {
  ForEachPvChunks(a.head_dim, [&]<int kChunks>(int64_t d0, bool first) {
    WidePvBlock<kRows, kChunks, kCode, kBlocked>(a, table, d0, first);
  });
}

// PV of every row (PvAllRows).
template <Code kCode>
void WidePvAllRows(const WidePvPass& a, int64_t rows, const Fp8Table* table) {
  PvAllRows(a, rows, [&]<int kRows>(const WidePvPass& block) {
    WidePvRows<kRows, kCode>(block, table);
  });
}

// The instances for K/V of kDtype: bf16 and f16 widened as they are, 8-bit
// floats through their table (e4m3fn times 2^-8), either inside the loops
// (kFp8Source::kInLoops) or first into bf16 scratch rows that the bf16
// loops then read (kThroughScratch: with more rows per kv head than a
// decode tile has, each 4-row block would convert the tile again).
template <DType kDtype>
constexpr Code kCodeOf = kDtype == DType::kBF16  ? Code::kBf16
                         : kDtype == DType::kF16 ? Code::kF16
                         : kDtype == DType::kI8  ? Code::kI8
                                                 : Code::kFp8;
enum class Fp8Source : uint8_t { kInLoops, kThroughScratch };

template <DType kDtype, Fp8Source kFp8 = Fp8Source::kInLoops>
void Logits(const QueryRows& q, const KvTile& tile, const TileLogits& s,
            const TileScratch& scratch) {
  if (q.rows <= 0 || tile.n <= 0) return;
  if constexpr (kCodeOf<kDtype> != Code::kFp8) {
    WideLogitsRows<kCodeOf<kDtype>>(q, tile.k, tile, s, nullptr);
  } else if constexpr (kFp8 == Fp8Source::kInLoops) {
    WideLogitsRows<Code::kFp8>(q, tile.k, tile, s, Fp8TableOf(kDtype, /*e4m3_scaled=*/true));
  } else {
    Fp8RowsToBf16Impl(*Fp8TableOf(kDtype, /*e4m3_scaled=*/true), tile.k, tile.n, tile.head_dim,
                      scratch);
    WideLogitsRows<Code::kBf16>(q, KvRows{scratch.converted, 0, tile.n}, tile, s, nullptr);
  }
}

template <DType kDtype, Fp8Source kFp8 = Fp8Source::kInLoops>
void Pv(const TileLogits& p, const KvTile& tile, const SoftmaxState& state,
        const TileScratch& scratch) {
  if (tile.n <= 0) return;
  WidePvPass a = PvPassOver<float>(tile, state);
  a.w = p.s;
  a.w_stride = p.stride;
  if constexpr (kCodeOf<kDtype> != Code::kFp8) {
    WidePvAllRows<kCodeOf<kDtype>>(a, p.rows, nullptr);
  } else if constexpr (kFp8 == Fp8Source::kInLoops) {
    WidePvAllRows<Code::kFp8>(a, p.rows, Fp8TableOf(kDtype, /*e4m3_scaled=*/true));
  } else {
    Fp8RowsToBf16Impl(*Fp8TableOf(kDtype, /*e4m3_scaled=*/true), tile.v, tile.n, tile.head_dim,
                      scratch);
    a.v = KvRows{scratch.converted, 0, tile.n};
    WidePvAllRows<Code::kBf16>(a, p.rows, nullptr);
  }
}

template <Code kCode>
RPA_AVX512_TARGET bool WideDecodeTileImpl(const QueryRows& q_rows, const KvTile& tile,
                                          float logit_scale, const SoftmaxState& state,
                                          const Fp8Table* table) {
  const Fp8Lut lut = LoadLut(kCode == Code::kFp8 ? table : nullptr);
  const __m512 scale = _mm512_set1_ps(logit_scale);
  const int64_t rows = q_rows.rows;
  const float* q[4];
  FusedQueryRows(q_rows, q);
  // Logits, then weights, in blocks of 4 keys: lane r * 4 + t = (row r, key 4b + t).
  alignas(64) float w[kFusedMaxKeys / 4 * 16];
  DecodeTileState next;
  const auto block = [&](const void* const* k) RPA_AVX512_TARGET {
    return _mm512_mul_ps(WideLogitsVector<4, 4, kCode>(q, k, tile.head_dim, lut), scale);
  };
  if (!DecodeTileWeights(tile, rows, block, state, w, &next)) return false;
  WidePvPass a = PvPassOver<float>(tile, state);
  a.w = w;
  a.rows = rows;
  a.alpha = next.alpha;
  WidePvRows<4, kCode, true>(a, table);
  return true;
}

template <DType kDtype>
bool DecodeTile(const QueryRows& q, const KvTile& tile, float logit_scale,
                const SoftmaxState& state) {
  return WideDecodeTileImpl<kCodeOf<kDtype>>(q, tile, logit_scale, state,
                                             Fp8TableOf(kDtype, /*e4m3_scaled=*/true));
}

// q row -> kF32EvenOdd: each 32 dims (dim_pad is a multiple of kDimAlign)
// split by two permutes into the even ones, then the odd ones.
RPA_AVX512_TARGET float PrepareEvenOdd(const float* q, int64_t /*head_dim*/, int64_t dim_pad,
                                       void* out) {
  static_assert(kDimAlign % 32 == 0);
  float* dst = static_cast<float*>(out);
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t d = 0; d < dim_pad; d += 32) {
    const __m512 lo = _mm512_loadu_ps(q + d), hi = _mm512_loadu_ps(q + d + 16);
    _mm512_storeu_ps(dst + d, _mm512_permutex2var_ps(lo, even, hi));
    _mm512_storeu_ps(dst + d + 16, _mm512_permutex2var_ps(lo, odd, hi));
  }
  return 1.0f;
}

template <DType kDtype>
constexpr ProductKernel kWide = {"avx512_wide",        QueryFormat::kF32EvenOdd,
                                 PrepareEvenOdd,       AccOrder::kEvenOdd,
                                 /*e4m3_scaled=*/true, /*prepare_tile=*/nullptr,
                                 Logits<kDtype>,       Pv<kDtype>};

template <DType kDtype>
constexpr ProductKernel kWideFp8Scratch = {
    "avx512_wide_fp8_scratch", QueryFormat::kF32EvenOdd,
    PrepareEvenOdd,            AccOrder::kEvenOdd,
    /*e4m3_scaled=*/true,      /*prepare_tile=*/nullptr,
    Logits<kDtype, Fp8Source::kThroughScratch>, Pv<kDtype, Fp8Source::kThroughScratch>};

template <DType kDtype>
constexpr FusedTileKernel kWideDecode = {
    "avx512_wide_decode", QueryFormat::kF32EvenOdd, PrepareEvenOdd, AccOrder::kEvenOdd,
    /*e4m3_scaled=*/true,
    // Computes 4 rows whatever the group: below 3 the unfused products cost less.
    /*min_rows=*/3, /*max_rows=*/4, DecodeTile<kDtype>};

}  // namespace
}  // namespace avx512

KvRows Fp8RowsToBf16(DType dtype, const KvRows& rows, int64_t n, int64_t head_dim,
                     const TileScratch& scratch) {
  avx512::Fp8RowsToBf16Impl(*avx512::Fp8TableOf(dtype, /*e4m3_scaled=*/true), rows, n, head_dim,
                            scratch);
  return KvRows{scratch.converted, 0, n};
}

const ProductKernel* Avx512Wide(DType kv_dtype) {
  return KernelForKvDtype<ProductKernel, DType::kBF16, DType::kF16, DType::kF8E4M3FN,
                          DType::kF8E5M2, DType::kI8>(
      kv_dtype, []<DType kDtype>() { return &avx512::kWide<kDtype>; });
}

const ProductKernel* Avx512WideFp8Scratch(DType kv_dtype) {
  return KernelForKvDtype<ProductKernel, DType::kF8E4M3FN, DType::kF8E5M2>(
      kv_dtype, []<DType kDtype>() { return &avx512::kWideFp8Scratch<kDtype>; });
}

const FusedTileKernel* Avx512WideDecode(DType kv_dtype) {
  return KernelForKvDtype<FusedTileKernel, DType::kBF16, DType::kF16, DType::kF8E4M3FN,
                          DType::kF8E5M2, DType::kI8>(
      kv_dtype, []<DType kDtype>() { return &avx512::kWideDecode<kDtype>; });
}

}  // namespace rpa::internal

#endif  // __x86_64__
