// 8-bit (e4m3fn, e5m2, int8) decode tiles in f16 arithmetic (AVX512-FP16).
//
// Arithmetic: an e5m2 code is the high byte of its f16; an e4m3fn code's
// bits moved into an f16 (sign to bit 15, the other 7 bits to bits 13-7)
// are its value times 2^-8 exactly, subnormals included; an int8 code,
// sign-extended to a word, converts to f16 exactly (vcvtw2ph): 1 to 3
// vector ops per 32 codes. Products and the tile's sums by vfmadd231ph; the
// 4 x 4 logits tree on halves, then f32; softmax, m, l and the accumulator stay
// f32 (avx512_common.h, shared with the f32 fused tile). q is stored once per
// task in f16 (kHalf), scaled by a power of 2 so that no f16 sum can
// overflow. Error: logits ~4e-4 of their magnitude, outputs ~1e-3 of |V|
// (docs/decisions.md).
//
// Shapes: 1-4 rows [rows, RoundUp(dim_pad, 64)] f16 x a tile of <= 32 keys.
//
// Dispatch chooses it first for 8-bit decode (<= 8 rows per kv head, no
// soft cap) where the CPU has AVX512-FP16; it declines (state untouched)
// tiles with a NaN or inf code, or whose largest |logit| exceeds 16, and
// the widening fused tile takes them.
#include "kernel/avx512_fp16_decode.h"

#if defined(__x86_64__)
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernel/avx512_common.h"

namespace rpa::internal {
namespace avx512 {
namespace {

// AVX512-FP16 arithmetic on 32 halves held in an __m512, by inline
// assembly: Clang 14 declares the f16 vector types and intrinsics only when
// the whole file is compiled for AVX512-FP16, which the other paths here
// must not be. Called only where CpuFeatures::avx512fp16.
RPA_AVX512_TARGET __attribute__((always_inline)) inline __m512 HalfFma(__m512 a, __m512 b,
                                                                   __m512 acc) {
  __asm__("vfmadd231ph %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}
// The elements [d, d + 64) of a row that lie below head_dim.
inline __mmask64 ChunkMask64(int64_t d, int64_t head_dim) {
  const int64_t left = head_dim - d;
  return left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
}

// The largest |logit| (after scaling) that a tile's maximum may have: past
// it the f16 rounding of the dominant logits (~2^-11 of each partial sum)
// would move their weights by more than ~0.6%.
inline constexpr float kHalfMaxLogit = 16.0f;

// The largest magnitude of a code (e4m3fn as stored here, times 2^-8; int8
// -128), and the weights' scale that keeps a tile's 32 weighted values below
// 65504.
template <DType kDtype>
inline constexpr float kHalfCodeMax = kDtype == DType::kF8E5M2  ? 57344.0f
                                      : kDtype == DType::kI8    ? 128.0f
                                                                : 448.0f / 256.0f;
template <DType kDtype>
inline constexpr float kHalfWeightScale = kDtype == DType::kF8E5M2 ? 1.0f / 32 : 1.0f;

// The non-finite codes (e4m3fn 0x7F and 0xFF would come out of CodesToHalf
// finite) are seen at the byte level: *seen keeps each byte's maximum of
// code | (the bits that are not the NaN/inf pattern's), 0xFF once such a
// code went by (SawNonFiniteCode). Every int8 code is finite.
template <DType kDtype>
RPA_AVX512_TARGET __attribute__((always_inline)) inline void SeeCodes(__m512i x, __m512i* seen) {
  if constexpr (kDtype != DType::kI8) {
    // e5m2: exponent 11111.
    const char others = static_cast<char>(kDtype == DType::kF8E5M2 ? 0x83 : 0x80);
    *seen = _mm512_max_epu8(*seen, _mm512_or_si512(x, _mm512_set1_epi8(others)));
  }
}

// 32 int16 to f16 (vcvtw2ph; exact below 2049 in magnitude), by inline
// assembly as HalfFma.
RPA_AVX512_TARGET __attribute__((always_inline)) inline __m512i WordsToHalf(__m512i x) {
  __m512i h;
  __asm__("vcvtw2ph %1, %0" : "=v"(h) : "v"(x));
  return h;
}

// 64 codes as f16 bits, lane-interleaved as the byte unpacks leave them: a
// = elements {0-7, 16-23, 32-39, 48-55}, b = {8-15, 24-31, 40-47, 56-63}
// (QRowToHalf stores q in the same order); the codes are seen (SeeCodes).
template <DType kDtype>
RPA_AVX512_TARGET __attribute__((always_inline)) inline void CodesToHalf(__m512i x, __m512i* a,
                                                                      __m512i* b, __m512i* seen) {
  SeeCodes<kDtype>(x, seen);
  const __m512i zero = _mm512_setzero_si512();
  *a = _mm512_unpacklo_epi8(zero, x);  // The code in a word's high byte.
  *b = _mm512_unpackhi_epi8(zero, x);
  if constexpr (kDtype == DType::kI8) {
    // Sign-extended by the arithmetic shift, then converted (exact).
    *a = WordsToHalf(_mm512_srai_epi16(*a, 8));
    *b = WordsToHalf(_mm512_srai_epi16(*b, 8));
  } else if constexpr (kDtype == DType::kF8E4M3FN) {
    // Arithmetic shift by 1: s s eeee mmm 0000000; then bit 14 cleared.
    const __m512i clear14 = _mm512_set1_epi16(static_cast<short>(0xBFFF));
    *a = _mm512_and_si512(_mm512_srai_epi16(*a, 1), clear14);
    *b = _mm512_and_si512(_mm512_srai_epi16(*b, 1), clear14);
  }
}

RPA_AVX512_TARGET __attribute__((always_inline)) inline bool SawNonFiniteCode(__m512i seen) {
  return _mm512_cmpeq_epi8_mask(seen, _mm512_set1_epi8(-1)) != 0;
}

// The logits of 4 rows x 4 keys (lane r * 4 + t), in f16 with the sums
// finished in f32.
template <DType kDtype>
RPA_AVX512_TARGET __attribute__((always_inline)) inline __m512 HalfLogitsVector(
    const uint16_t* const* q, const void* const* k, int64_t head_dim, __m512i* seen) {
  __m512 acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; d += 64) {
    const __mmask64 mask = ChunkMask64(d, head_dim);
    __m512 ka[4], kb[4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      __m512i a, b;
      CodesToHalf<kDtype>(_mm512_maskz_loadu_epi8(mask, static_cast<const uint8_t*>(k[t]) + d), &a,
                          &b, seen);
      ka[t] = _mm512_castsi512_ps(a);
      kb[t] = _mm512_castsi512_ps(b);
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const __m512 qa = _mm512_castsi512_ps(_mm512_loadu_si512(q[r] + d));
      const __m512 qb = _mm512_castsi512_ps(_mm512_loadu_si512(q[r] + d + 32));
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        acc[r * 4 + t] = HalfFma(qa, ka[t], acc[r * 4 + t]);
        acc[r * 4 + t] = HalfFma(qb, kb[t], acc[r * 4 + t]);
      }
    }
  }
  return BlockLogits<true>(acc);
}

// One pass of the f16 PV over the kChunks 64-dim chunks from d0: the tile's
// sums of weighted V rows in f16 registers, then acc = alpha acc + them, in
// the widening path's order (WideQIndex), for the rows that exist. wh:
// the weights as f16 pairs (both halves the same), lane r * 4 + t % 4 of
// block t / 4. first_pass: prefetch the next tile, and look at the row's
// codes past this pass too, so that a NaN or inf code anywhere is seen
// before the first pass writes acc.
struct HalfPv {
  const uint32_t* wh = nullptr;  // [tile blocks of 16] the weights as f16 pairs.
  int64_t rows = 0;
  KvRows v;                      // [n] V rows.
  int64_t n = 0;
  int64_t head_dim = 0;
  const float* alpha = nullptr;  // [rows] the old accumulators' factors.
  float* acc = nullptr;          // [rows, acc_stride] kEvenOdd.
  int64_t acc_stride = 0;
  const KvRows* prefetch = nullptr;  // The next tile's V rows; null: none.
  int64_t prefetch_bytes = 0;
};

template <int kChunks, DType kDtype>
RPA_AVX512_TARGET __attribute__((always_inline)) inline bool HalfPvPass(const HalfPv& args,
                                                                        int64_t d0,
                                                                        bool first_pass) {
  const uint32_t* wh = args.wh;
  const int64_t rows = args.rows, n = args.n, head_dim = args.head_dim;
  const KvRows v_rows = args.v;
  const float* alpha = args.alpha;
  float* acc = args.acc;
  const int64_t acc_stride = args.acc_stride;
  const KvRows pf = first_pass && args.prefetch != nullptr ? *args.prefetch : KvRows{};
  const bool check_rest = first_pass;
  // Index (c * 2 + h) * 4 + r: chunk c, h = 0 for the a half (b: 1), row r.
  __m512 sum[kChunks * 8];
#pragma GCC unroll 16
  for (int i = 0; i < kChunks * 8; ++i) sum[i] = _mm512_setzero_ps();
  __mmask64 mask[kChunks];
  for (int c = 0; c < kChunks; ++c) mask[c] = ChunkMask64(d0 + 64 * c, head_dim);
  __m512i seen = _mm512_setzero_si512();
  for (int64_t t = 0; t < n; ++t) {
    PrefetchRows(pf, t, 1, args.prefetch_bytes);
    const uint8_t* row = static_cast<const uint8_t*>(v_rows[t]);
    __m512 va[kChunks], vb[kChunks];
#pragma GCC unroll 2
    for (int c = 0; c < kChunks; ++c) {
      __m512i a, b;
      CodesToHalf<kDtype>(_mm512_maskz_loadu_epi8(mask[c], row + d0 + 64 * c), &a, &b, &seen);
      va[c] = _mm512_castsi512_ps(a);
      vb[c] = _mm512_castsi512_ps(b);
    }
    if (check_rest) {
      for (int64_t d = d0 + 64 * kChunks; d < head_dim; d += 64) {
        SeeCodes<kDtype>(_mm512_maskz_loadu_epi8(ChunkMask64(d, head_dim), row + d), &seen);
      }
    }
    const uint32_t* w = wh + (t >> 2) * 16 + (t & 3);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const __m512 p = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(w[r * 4])));
#pragma GCC unroll 2
      for (int c = 0; c < kChunks; ++c) {
        sum[c * 8 + r] = HalfFma(p, va[c], sum[c * 8 + r]);
        sum[c * 8 + 4 + r] = HalfFma(p, vb[c], sum[c * 8 + 4 + r]);
      }
    }
  }
  if (SawNonFiniteCode(seen)) return false;
  // A copy for the rows' loop: indexed by a run-time row, sum itself would
  // live on the stack, stored on every key.
  __m512 done[kChunks * 8];
#pragma GCC unroll 16
  for (int i = 0; i < kChunks * 8; ++i) done[i] = sum[i];
  // From the unpacks' order to WideQIndex's: of dims {0-7, 16-23} (a's
  // half) and {8-15, 24-31} (b's), the even dims, then the odd ones.
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 14, 12, 10, 8, 22, 20, 18, 16, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 15, 13, 11, 9, 23, 21, 19, 17, 7, 5, 3, 1);
  const __m512 unscale = _mm512_set1_ps(1.0f / kHalfWeightScale<kDtype>);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 keep = _mm512_set1_ps(alpha[r]);
    for (int c = 0; c < kChunks; ++c) {
      const __m512i a = _mm512_castps_si512(done[c * 8 + r]);
      const __m512i b = _mm512_castps_si512(done[c * 8 + 4 + r]);
      for (int half = 0; half < 2; ++half) {
        const int64_t d = d0 + 64 * c + 32 * half;
        if (d >= head_dim) break;
        const __m512 fa = _mm512_cvtph_ps(half == 0 ? _mm512_castsi512_si256(a)
                                                    : _mm512_extracti64x4_epi64(a, 1));
        const __m512 fb = _mm512_cvtph_ps(half == 0 ? _mm512_castsi512_si256(b)
                                                    : _mm512_extracti64x4_epi64(b, 1));
        float* dst = acc + r * acc_stride + d;
        _mm512_storeu_ps(dst, _mm512_fmadd_ps(_mm512_permutex2var_ps(fa, even, fb), unscale,
                                              _mm512_mul_ps(_mm512_loadu_ps(dst), keep)));
        _mm512_storeu_ps(dst + 16,
                         _mm512_fmadd_ps(_mm512_permutex2var_ps(fa, odd, fb), unscale,
                                         _mm512_mul_ps(_mm512_loadu_ps(dst + 16), keep)));
      }
    }
  }
  return true;
}

// q row -> f16 in CodesToHalf's order, scaled by 2^e so that its products
// with a head of codes (at most kHalfCodeMax each) sum to less than 65504,
// and |q| < 16; returns 2^-e (1 for a zero or non-finite row: inf and NaN
// stay and make the tile decline).
template <DType kDtype>
RPA_AVX512_TARGET float QRowToHalfImpl(const float* q, int64_t head_dim, uint16_t* out) {
  __m512 peak = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; d += 16) {
    const __mmask16 mask = head_dim - d >= 16 ? 0xFFFF : (1u << (head_dim - d)) - 1;
    peak = _mm512_max_ps(peak, _mm512_abs_ps(_mm512_maskz_loadu_ps(mask, q + d)));
  }
  const float max_abs = _mm512_reduce_max_ps(peak);
  int exponent = 0;
  if (max_abs > 0.0f && max_abs <= std::numeric_limits<float>::max()) {
    // |q| < 2^limit, 2^limit <= 65504 / (dims x kHalfCodeMax), limit <= 4.
    int room = 0;
    std::frexp(65504.0f / (static_cast<float>(RoundUp(head_dim, kHalfDimAlign)) *
                           kHalfCodeMax<kDtype>),
               &room);
    const int limit = std::min(4, room - 1);
    int top = 0;
    std::frexp(max_abs, &top);  // max_abs = f 2^top, f in [0.5, 1).
    exponent = std::clamp(limit - top, -120, 120);
  }
  const __m512 scale = _mm512_set1_ps(std::ldexp(1.0f, exponent));
  for (int64_t d = 0; d < head_dim; d += 64) {
    __m512 x[4];
    for (int i = 0; i < 4; ++i) {
      const int64_t left = head_dim - d - 16 * i;
      const __mmask16 mask = left >= 16 ? 0xFFFF : left <= 0 ? 0 : (1u << left) - 1;
      x[i] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, q + d + 16 * i), scale);
    }
    // a: dims {0-7, 16-23 | 32-39, 48-55}; b: {8-15, 24-31 | 40-47, 56-63}.
    const int round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    uint16_t* dst = out + d;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                        _mm512_cvtps_ph(_mm512_shuffle_f32x4(x[0], x[1], 0x44), round));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16),
                        _mm512_cvtps_ph(_mm512_shuffle_f32x4(x[2], x[3], 0x44), round));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32),
                        _mm512_cvtps_ph(_mm512_shuffle_f32x4(x[0], x[1], 0xEE), round));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 48),
                        _mm512_cvtps_ph(_mm512_shuffle_f32x4(x[2], x[3], 0xEE), round));
  }
  return std::ldexp(1.0f, -exponent);
}

template <DType kDtype>
RPA_AVX512_TARGET bool HalfDecodeTileImpl(const QueryRows& q_rows, const KvTile& tile,
                                          float logit_scale, const SoftmaxState& state) {
  const int64_t rows = q_rows.rows, n = tile.n, head_dim = tile.head_dim;
  const uint16_t* q[4];
  alignas(16) float row_scale[4];
  for (int r = 0; r < 4; ++r) {
    const int64_t rr = r < rows ? r : rows - 1;  // Rows past `rows` repeat the last one.
    q[r] = static_cast<const uint16_t*>(q_rows.data) + rr * q_rows.stride;
    row_scale[r] = logit_scale * q_rows.unscale[rr];
  }
  const __m512 scale = _mm512_permutexvar_ps(
      _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
      _mm512_castps128_ps512(_mm_load_ps(row_scale)));
  alignas(64) float w[kFusedMaxKeys / 4 * 16];
  __m512 vmax;
  __mmask16 nan;
  __m512i seen = _mm512_setzero_si512();
  DecodeTileLogits(
      tile,
      [&](const void* const* k) RPA_AVX512_TARGET {
        return _mm512_mul_ps(HalfLogitsVector<kDtype>(q, k, head_dim, &seen), scale);
      },
      w, &vmax, &nan);
  // Logits near the row's maximum carry its weight; their f16 error grows
  // with their magnitude (~4e-4 of it here), so a tile whose largest logit
  // is far from 0 (over kHalfMaxLogit either way) is left to f32.
  const __m512 tile_max = _mm512_abs_ps(RowMax(vmax));
  const bool large = _mm512_cmp_ps_mask(tile_max, _mm512_set1_ps(kHalfMaxLogit), _CMP_GT_OQ) != 0;
  DecodeTileState next;
  if (large || SawNonFiniteCode(seen) ||
      !DecodeTileSoftmax(w, n, vmax, nan, rows, state.m, state.l, &next)) {
    return false;
  }
  alignas(64) uint32_t wh[kFusedMaxKeys / 4 * 16];
  for (int64_t b = 0; 4 * b < n; ++b) {
    const __m512 p = _mm512_mul_ps(_mm512_load_ps(w + 16 * b),
                                   _mm512_set1_ps(kHalfWeightScale<kDtype>));
    const __m512i h =
        _mm512_cvtepu16_epi32(_mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm512_store_si512(wh + 16 * b, _mm512_or_si512(h, _mm512_slli_epi32(h, 16)));
  }
  HalfPv pv;
  pv.wh = wh;
  pv.rows = rows;
  pv.v = tile.v;
  pv.n = n;
  pv.head_dim = head_dim;
  pv.alpha = next.alpha;
  pv.acc = state.acc;
  pv.acc_stride = state.stride;
  pv.prefetch = tile.v_next.count > 0 ? &tile.v_next : nullptr;
  pv.prefetch_bytes = tile.row_bytes;
  int64_t d = 0;
  for (; d + 64 < head_dim; d += 128) {
    if (!HalfPvPass<2, kDtype>(pv, d, d == 0)) return false;
  }
  if (d < head_dim && !HalfPvPass<1, kDtype>(pv, d, d == 0)) return false;
  next.Commit(rows, state.m, state.l);
  return true;
}

template <DType kDtype>
float PrepareHalf(const float* q, int64_t head_dim, int64_t /*dim_pad*/, void* out) {
  return QRowToHalfImpl<kDtype>(q, head_dim, static_cast<uint16_t*>(out));
}

// The instance for e4m3fn, e5m2 or int8 K/V.
template <DType kDtype>
constexpr FusedTileKernel kHalfDecode = {
    "avx512fp16_decode", QueryFormat::kHalf, PrepareHalf<kDtype>, AccOrder::kEvenOdd,
    /*e4m3_scaled=*/true,
    // Cheaper than the unfused products for any group, even computing 4 rows.
    /*min_rows=*/1, /*max_rows=*/4, HalfDecodeTileImpl<kDtype>};

}  // namespace
}  // namespace avx512

const FusedTileKernel* Avx512Fp16Decode(DType kv_dtype) {
  return KernelForKvDtype<FusedTileKernel, DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8>(
      kv_dtype, []<DType kDtype>() { return &avx512::kHalfDecode<kDtype>; });
}

}  // namespace rpa::internal

#endif  // __x86_64__
