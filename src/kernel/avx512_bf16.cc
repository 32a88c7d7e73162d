// The AVX-512 BF16 path: QK^T and PV on bf16 K/V with vdpbf16ps, which
// multiplies pairs of bf16 and adds both products to an f32 lane. Debian's
// Highway 1.0.3 emulates bf16 dot products, so this sits beside the Highway
// kernels: intrinsics in functions compiled for the instructions they use,
// called only when CpuHasAvx512Bf16() (never -march=native for the file).
//
// Logits: a block of kRows rows x kTokens keys (kRows * kTokens = 16) keeps
// 16 accumulators; each K chunk is loaded once per row block and each q chunk
// once per key block, and one transpose-and-add tree turns the 16
// accumulators into one vector of 16 logits (instead of 16 horizontal sums).
//
// PV: vdpbf16ps sums over pairs of keys, so V rows t and t+1 are interleaved
// in registers (vpunpck{l,h}wd); the accumulator then holds each 32-dim chunk
// in the order Bf16AccIndex describes, undone once per task.
//
// Also here: the widening path (bf16 and 8-bit floats widened to f32 in
// registers, f32 FMA), its fused decode tile, and the 8-bit float decode
// tile in f16 arithmetic (AVX512-FP16); each section says why.
#include <cstdint>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernel/kernel.h"
#include "rpa/dtype.h"

#if defined(__x86_64__) || defined(__i386__)
// GCC 12's _mm512_undefined_* are written `__m512 __Y = __Y;`, which
// -Wuninitialized flags wherever they inline (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cpuid.h>
#include <immintrin.h>
#define RPA_HAVE_X86 1
#else
#define RPA_HAVE_X86 0
#endif

namespace rpa::internal {

#if RPA_HAVE_X86

bool CpuHasAvx512Bf16() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid_count(1, 0, eax, ebx, ecx, edx);
    const bool osxsave = (ecx >> 27) & 1;
    if (!osxsave) return false;
    unsigned xcr0_lo = 0, xcr0_hi = 0;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    // XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM state enabled by the OS.
    if ((xcr0_lo & 0xE6) != 0xE6) return false;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    const bool avx512f = (ebx >> 16) & 1;
    const bool avx512bw = (ebx >> 30) & 1;
    const bool avx512vl = (ebx >> 31) & 1;
    if (!(avx512f && avx512bw && avx512vl)) return false;
    __cpuid_count(7, 1, eax, ebx, ecx, edx);
    const bool avx512bf16 = (eax >> 5) & 1;
    return avx512bf16;
  }();
  return has;
}

bool CpuHasAvx512Bw() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid_count(1, 0, eax, ebx, ecx, edx);
    if (!((ecx >> 27) & 1)) return false;
    unsigned xcr0_lo = 0, xcr0_hi = 0;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & 0xE6) != 0xE6) return false;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    return ((ebx >> 16) & 1) && ((ebx >> 30) & 1) && ((ebx >> 31) & 1);  // F, BW, VL.
  }();
  return has;
}

bool CpuHasAvx512Fp16() {
  static const bool has = [] {
    if (!CpuHasAvx512Bw()) return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    return ((edx >> 23) & 1) != 0;  // AVX512-FP16.
  }();
  return has;
}

#define RPA_BF16_TARGET __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl")))
// The widening path's instructions, a subset of the above: its helpers
// inline into both paths' functions.
#define RPA_WIDE_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))

namespace {

// AVX512-FP16 arithmetic on 32 halves held in an __m512, by inline
// assembly: Clang 14 declares the f16 vector types and intrinsics only when
// the whole file is compiled for AVX512-FP16, which the other paths here
// must not be. Called only where CpuHasAvx512Fp16().
RPA_WIDE_TARGET __attribute__((always_inline)) inline __m512 HalfFma(__m512 a, __m512 b,
                                                                   __m512 acc) {
  __asm__("vfmadd231ph %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// x + y as 16 floats, or (kHalf) as 32 halves (vaddph).
template <bool kHalf>
RPA_WIDE_TARGET __attribute__((always_inline)) inline __m512 AddLanes(__m512 x, __m512 y) {
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
RPA_WIDE_TARGET __attribute__((always_inline)) inline __m512 SumEach16(const __m512* a) {
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
RPA_WIDE_TARGET __attribute__((always_inline)) inline __m512 BlockLogits(const __m512* acc) {
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

// Stores a kRows x kTokens block's logits (lane r * kTokens + t) for the
// rows and tokens that exist.
template <int kRows, int kTokens>
RPA_WIDE_TARGET __attribute__((always_inline)) inline void StoreLogitsBlock(
    __m512 logits, int64_t rows, int64_t tokens, float* s, int64_t s_stride) {
  alignas(64) float sums[16];
  _mm512_store_ps(sums, logits);
  const int64_t valid_rows = rows < kRows ? rows : kRows;
  const int64_t valid_tokens = tokens < kTokens ? tokens : kTokens;
  for (int64_t r = 0; r < valid_rows; ++r) {
    std::memcpy(s + r * s_stride, sums + r * kTokens, sizeof(float) * valid_tokens);
  }
}

// The elements of the 32-element chunk at d (< head_dim) that lie below
// head_dim: all of a whole chunk, the tail of the last one.
inline __mmask32 ChunkMask(int64_t d, int64_t head_dim) {
  const int64_t left = head_dim - d;
  return left >= 32 ? ~__mmask32{0} : (__mmask32{1} << left) - 1;
}

RPA_BF16_TARGET inline __m512bh AsBh(__m512i v) { return reinterpret_cast<__m512bh>(v); }

// Logits of kRows rows x kTokens keys; rows/tokens beyond the valid counts
// keep zero accumulators and are not stored.
template <int kRows, int kTokens, bool kLo>
RPA_BF16_TARGET void LogitsBlock(const uint16_t* q_hi, const uint16_t* q_lo, int64_t q_stride,
                                 int64_t rows, const void* const* k_rows, int64_t tokens,
                                 int64_t head_dim, float* s, int64_t s_stride) {
  static_assert(kRows * kTokens == 16);
  __m512 acc[16];
  #pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  const uint16_t* k[kTokens];
  #pragma GCC unroll 16
  for (int t = 0; t < kTokens; ++t) {
    k[t] = static_cast<const uint16_t*>(k_rows[t < tokens ? t : 0]);
  }
  for (int64_t d = 0; d < head_dim; d += 32) {
    const __mmask32 mask = ChunkMask(d, head_dim);
    __m512i kv[kTokens];
    #pragma GCC unroll 16
    for (int t = 0; t < kTokens; ++t) kv[t] = _mm512_maskz_loadu_epi16(mask, k[t] + d);
    #pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      const __m512i qh = _mm512_loadu_si512(q_hi + r * q_stride + d);
      #pragma GCC unroll 16
      for (int t = 0; t < kTokens; ++t) {
        acc[r * kTokens + t] = _mm512_dpbf16_ps(acc[r * kTokens + t], AsBh(qh), AsBh(kv[t]));
      }
      if constexpr (kLo) {
        const __m512i ql = _mm512_loadu_si512(q_lo + r * q_stride + d);
        #pragma GCC unroll 16
        for (int t = 0; t < kTokens; ++t) {
          acc[r * kTokens + t] = _mm512_dpbf16_ps(acc[r * kTokens + t], AsBh(ql), AsBh(kv[t]));
        }
      }
    }
  }
  StoreLogitsBlock<kRows, kTokens>(BlockLogits(acc), rows, tokens, s, s_stride);
}

// Row i of a tile at rows[i] + offset bytes: one array of row pointers (of
// the first kv head) serves every kv head of a multi-head tile.
struct OffsetRows {
  const uint8_t* const* rows;
  int64_t offset;
  const void* operator[](int64_t i) const { return rows[i] + offset; }
};

// Prefetches rows [t, t + n) of the next tile that exist.
template <class Rows>
inline void PrefetchRows(const Rows& rows, int64_t count, int64_t t, int64_t n, int64_t bytes) {
  for (int64_t i = t; i < t + n && i < count; ++i) PrefetchRow(rows[i], bytes);
}

template <bool kLo>
RPA_BF16_TARGET void LogitsImpl(const uint16_t* q_hi, const uint16_t* q_lo, int64_t q_stride,
                                int64_t rows, const void* const* k_rows, int64_t tokens,
                                int64_t head_dim, float* s, int64_t s_stride,
                                const void* const* pf, int64_t pf_count) {
  const int64_t row_bytes = head_dim * 2;
  // The first row block issues the next tile's prefetches (and any left
  // over when the next tile is longer).
  if (pf != nullptr) {
    const int64_t per = rows > 2 ? 4 : rows == 2 ? 8 : 16;
    if (pf_count > RoundUp(tokens, per)) {
      PrefetchRows(pf, pf_count, RoundUp(tokens, per), pf_count, row_bytes);
    }
  }
  int64_t r = 0;
  // The row count picks the block shape so that decode with few q heads per
  // kv head (1 or 2) still fills all 16 accumulators.
  for (; r + 4 <= rows || (rows - r > 2); r += 4) {
    for (int64_t t = 0; t < tokens; t += 4) {
      if (r == 0 && pf != nullptr) PrefetchRows(pf, pf_count, t, 4, row_bytes);
      LogitsBlock<4, 4, kLo>(q_hi + r * q_stride, kLo ? q_lo + r * q_stride : nullptr, q_stride,
                             rows - r, k_rows + t, tokens - t, head_dim,
                             s + r * s_stride + t, s_stride);
    }
  }
  if (rows - r == 2) {
    for (int64_t t = 0; t < tokens; t += 8) {
      if (r == 0 && pf != nullptr) PrefetchRows(pf, pf_count, t, 8, row_bytes);
      LogitsBlock<2, 8, kLo>(q_hi + r * q_stride, kLo ? q_lo + r * q_stride : nullptr, q_stride,
                             2, k_rows + t, tokens - t, head_dim, s + r * s_stride + t,
                             s_stride);
    }
  } else if (rows - r == 1) {
    for (int64_t t = 0; t < tokens; t += 16) {
      if (r == 0 && pf != nullptr) PrefetchRows(pf, pf_count, t, 16, row_bytes);
      LogitsBlock<1, 16, kLo>(q_hi + r * q_stride, kLo ? q_lo + r * q_stride : nullptr,
                              q_stride, 1, k_rows + t, tokens - t, head_dim,
                              s + r * s_stride + t, s_stride);
    }
  }
}

// acc rows r < valid_rows (of kRows) += sum over key pairs of p * v; p2
// holds each row's weights as packed bf16 pairs (PackPairs).
template <int kRows>
RPA_BF16_TARGET void PvBlock(const uint32_t* p2, int64_t p_stride, int64_t valid_rows,
                             const void* const* v_rows, int64_t tokens, int64_t head_dim,
                             float* acc, int64_t acc_stride, const void* const* pf,
                             int64_t pf_count) {
  for (int64_t d = 0; d < head_dim; d += 32) {
    // The first chunk issues the next tile's prefetches, two rows per pair.
    const bool prefetch = d == 0 && pf != nullptr;
    const __mmask32 mask = ChunkMask(d, head_dim);
    __m512 lo[kRows], hi[kRows];
    for (int r = 0; r < kRows; ++r) {
      const int64_t rr = r < valid_rows ? r : 0;
      lo[r] = _mm512_loadu_ps(acc + rr * acc_stride + d);
      hi[r] = _mm512_loadu_ps(acc + rr * acc_stride + d + 16);
    }
    for (int64_t t = 0; t < tokens; t += 2) {
      if (prefetch) PrefetchRows(pf, pf_count, t, 2, head_dim * 2);
      const __m512i v0 =
          _mm512_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(v_rows[t]) + d);
      const __m512i v1 =
          t + 1 < tokens
              ? _mm512_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(v_rows[t + 1]) + d)
              : _mm512_setzero_si512();
      const __m512bh vl = AsBh(_mm512_unpacklo_epi16(v0, v1));
      const __m512bh vh = AsBh(_mm512_unpackhi_epi16(v0, v1));
      for (int r = 0; r < kRows; ++r) {
        const int64_t rr = r < valid_rows ? r : 0;
        const __m512bh pp = AsBh(_mm512_set1_epi32(static_cast<int>(p2[rr * p_stride + t / 2])));
        lo[r] = _mm512_dpbf16_ps(lo[r], pp, vl);
        hi[r] = _mm512_dpbf16_ps(hi[r], pp, vh);
      }
    }
    for (int r = 0; r < kRows && r < valid_rows; ++r) {
      _mm512_storeu_ps(acc + r * acc_stride + d, lo[r]);
      _mm512_storeu_ps(acc + r * acc_stride + d + 16, hi[r]);
    }
  }
}

// Bits of the bf16 value of each 8-bit float magnitude (code & 0x7F);
// e4m3fn scaled by 2^-8 (kernel.h).
struct Fp8Table {
  alignas(64) uint16_t bits[128];
};

Fp8Table MakeFp8Table(DType dtype) {
  Fp8Table t;
  for (int code = 0; code < 128; ++code) {
    const uint8_t byte = static_cast<uint8_t>(code);
    float f = LoadAsF32(dtype, &byte, 0);
    if (dtype == DType::kF8E4M3FN) f *= 1.0f / 256.0f;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    // Exact in bf16 (low half zero); NaN stays a quiet NaN.
    t.bits[code] = f != f ? uint16_t{0x7FC0} : static_cast<uint16_t>(u >> 16);
  }
  return t;
}

// Uses AVX-512 BW only: it serves the widening path too.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void Fp8RowsToBf16Impl(
    const Fp8Table& table, const void** rows, int64_t tokens, int64_t head_dim, uint16_t* dst,
    int64_t dst_stride) {
  const __m512i t0 = _mm512_load_si512(table.bits), t1 = _mm512_load_si512(table.bits + 32);
  const __m512i t2 = _mm512_load_si512(table.bits + 64), t3 = _mm512_load_si512(table.bits + 96);
  const __m512i sign_bit = _mm512_set1_epi16(0x80), bit6 = _mm512_set1_epi16(0x40);
  for (int64_t i = 0; i < tokens; ++i) {
    const uint8_t* src = static_cast<const uint8_t*>(rows[i]);
    uint16_t* out = dst + i * dst_stride;
    for (int64_t d = 0; d < head_dim; d += 32) {
      const __mmask32 mask = ChunkMask(d, head_dim);
      const __m512i x = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(mask, src + d));
      // permutex2var reads index bits [5:0]: entries 0-63 from (t0, t1),
      // 64-127 from (t2, t3); bit 6 picks between them.
      const __m512i lo = _mm512_permutex2var_epi16(t0, x, t1);
      const __m512i hi = _mm512_permutex2var_epi16(t2, x, t3);
      const __m512i mag = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(x, bit6), lo, hi);
      const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(x, sign_bit), 8);
      _mm512_storeu_si512(out + d, _mm512_or_si512(mag, sign));
    }
    rows[i] = out;
  }
}

// ---- The widening path: bf16 widened to f32 in registers, f32 FMA. A 32-bit
// lane of 32 loaded bf16 holds elements 2i (low half) and 2i + 1 (high
// half): a shift and a mask turn them into two f32 vectors, the even and the
// odd elements of the chunk, with no shuffle. q rows are stored in the same
// even/odd order (WideQIndex), so a dot product needs nothing else; PV
// accumulates in that order and RunTask puts it back.

RPA_WIDE_TARGET __attribute__((always_inline)) inline void Widen(__m512i raw, __m512* even,
                                                                 __m512* odd) {
  *even = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
  *odd = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(-65536)));
}

// The fp8 table (Fp8Table) in four registers, for converting in the loops.
struct Fp8Lut {
  __m512i t0, t1, t2, t3;
};

RPA_WIDE_TARGET __attribute__((always_inline)) inline Fp8Lut LoadLut(const Fp8Table* table) {
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

// Elements [d, d + 32) of a K/V row (masked: nothing past the row is read,
// the tail is 0) as f32, even elements in *even and odd ones in *odd. kFp8:
// the row holds 8-bit floats, converted in registers to bf16 exactly as
// Fp8RowsToBf16 does (two vpermi2w table lookups, the sign or-ed back), so
// no scratch row is written and read back.
template <bool kFp8>
RPA_WIDE_TARGET __attribute__((always_inline)) inline void LoadWide(const void* row, int64_t d,
                                                                    __mmask32 mask,
                                                                    const Fp8Lut& lut,
                                                                    __m512* even, __m512* odd) {
  if constexpr (kFp8) {
    const __m512i x = _mm512_cvtepu8_epi16(
        _mm256_maskz_loadu_epi8(mask, static_cast<const uint8_t*>(row) + d));
    // permutex2var reads index bits [5:0]: entries 0-63 from (t0, t1),
    // 64-127 from (t2, t3); bit 6 picks between them.
    const __m512i lo = _mm512_permutex2var_epi16(lut.t0, x, lut.t1);
    const __m512i hi = _mm512_permutex2var_epi16(lut.t2, x, lut.t3);
    const __m512i mag =
        _mm512_mask_blend_epi16(_mm512_test_epi16_mask(x, _mm512_set1_epi16(0x40)), lo, hi);
    // mag | (x << 8 & 0x8000): the sign bit back on top.
    const __m512i bits = _mm512_ternarylogic_epi32(mag, _mm512_slli_epi16(x, 8),
                                                   _mm512_set1_epi16(static_cast<short>(0x8000)),
                                                   0xF8);
    Widen(bits, even, odd);
  } else {
    Widen(_mm512_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(row) + d), even, odd);
  }
}

// The logits of a kRows x kTokens block (kRows * kTokens = 16) of key rows
// k[t]: lane r * kTokens + t of the result is q_r . k_t.
template <int kRows, int kTokens, bool kFp8>
RPA_WIDE_TARGET __attribute__((always_inline)) inline __m512 WideLogitsVector(
    const float* const* q, const void* const* k, int64_t head_dim, const Fp8Lut& lut) {
  static_assert(kRows * kTokens == 16);
  __m512 acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; d += 32) {
    const __mmask32 mask = ChunkMask(d, head_dim);
    __m512 ke[kTokens], ko[kTokens];
#pragma GCC unroll 16
    for (int t = 0; t < kTokens; ++t) LoadWide<kFp8>(k[t], d, mask, lut, &ke[t], &ko[t]);
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

template <int kRows, int kTokens, bool kFp8>
RPA_WIDE_TARGET void WideLogitsBlock(const float* q, int64_t q_stride, int64_t rows,
                                     const void* const* k_rows, int64_t tokens,
                                     int64_t head_dim, float* s, int64_t s_stride,
                                     const Fp8Table* table) {
  const Fp8Lut lut = LoadLut(kFp8 ? table : nullptr);
  const void* k[kTokens];
#pragma GCC unroll 16
  for (int t = 0; t < kTokens; ++t) k[t] = k_rows[t < tokens ? t : 0];
  const float* q_rows[kRows];
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) q_rows[r] = q + r * q_stride;
  StoreLogitsBlock<kRows, kTokens>(
      WideLogitsVector<kRows, kTokens, kFp8>(q_rows, k, head_dim, lut), rows, tokens, s,
      s_stride);
}

// acc rows (even/odd order) += sum_t p[r][t] * v_t for kRows rows, over the
// kChunks 32-dim chunks from d0: 2 chunks give 4 * kRows independent
// accumulator chains per key, enough to hide the FMA latency at 4 rows.
// p[r][t] is p[r * p_stride + t], or with kBlocked (4 rows) lane r * 4 + t % 4
// of block t / 4 (16 floats each), the fused decode tile's order.
// alpha (may be null): row r's accumulator is first scaled by alpha[r].
template <int kRows, int kChunks, bool kFp8, bool kBlocked = false,
          class Rows = const void* const*>
RPA_WIDE_TARGET void WidePvBlock(const float* p, int64_t p_stride, int64_t valid_rows,
                                 const Rows& v_rows, int64_t tokens, int64_t d0,
                                 int64_t head_dim, float* acc, int64_t acc_stride,
                                 const Rows* pf, int64_t pf_count, int64_t pf_bytes,
                                 const Fp8Table* table, const float* alpha = nullptr) {
  static_assert(!kBlocked || kRows == 4);
  const Fp8Lut lut = LoadLut(kFp8 ? table : nullptr);
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
      if (alpha != nullptr) {
        ae[c][r] = _mm512_mul_ps(ae[c][r], _mm512_set1_ps(alpha[rr]));
        ao[c][r] = _mm512_mul_ps(ao[c][r], _mm512_set1_ps(alpha[rr]));
      }
    }
  }
  for (int64_t t = 0; t < tokens; ++t) {
    if (pf != nullptr && t < pf_count) PrefetchRow((*pf)[t], pf_bytes);
    __m512 ve[kChunks], vo[kChunks];
#pragma GCC unroll 2
    for (int c = 0; c < kChunks; ++c) {
      LoadWide<kFp8>(v_rows[t], d0 + 32 * c, mask[c], lut, &ve[c], &vo[c]);
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

// The table of an 8-bit float K/V dtype, or null for bf16.
const Fp8Table* Fp8TableOf(DType dtype) {
  static const Fp8Table e4m3 = MakeFp8Table(DType::kF8E4M3FN);
  static const Fp8Table e5m2 = MakeFp8Table(DType::kF8E5M2);
  if (dtype == DType::kF8E4M3FN) return &e4m3;
  if (dtype == DType::kF8E5M2) return &e5m2;
  return nullptr;
}

template <bool kFp8>
void WideLogitsImpl(const float* q_eo, int64_t q_stride, int64_t rows, const void* const* k_rows,
                    int64_t tokens, int64_t head_dim, float* s, int64_t s_stride,
                    const void* const* pf, int64_t pf_count, int64_t pf_bytes,
                    const Fp8Table* table) {
  const int64_t row_bytes = pf_bytes;
  const int64_t per = rows > 2 ? 4 : rows == 2 ? 8 : 16;
  if (pf != nullptr && pf_count > RoundUp(tokens, per)) {
    PrefetchRows(pf, pf_count, RoundUp(tokens, per), pf_count, row_bytes);
  }
  int64_t r = 0;
  for (; r + 4 <= rows || (rows - r > 2); r += 4) {
    for (int64_t t = 0; t < tokens; t += 4) {
      if (r == 0 && pf != nullptr) PrefetchRows(pf, pf_count, t, 4, row_bytes);
      WideLogitsBlock<4, 4, kFp8>(q_eo + r * q_stride, q_stride, rows - r, k_rows + t,
                                  tokens - t, head_dim, s + r * s_stride + t, s_stride, table);
    }
  }
  if (rows - r == 2) {
    for (int64_t t = 0; t < tokens; t += 8) {
      if (r == 0 && pf != nullptr) PrefetchRows(pf, pf_count, t, 8, row_bytes);
      WideLogitsBlock<2, 8, kFp8>(q_eo + r * q_stride, q_stride, 2, k_rows + t, tokens - t,
                                  head_dim, s + r * s_stride + t, s_stride, table);
    }
  } else if (rows - r == 1) {
    for (int64_t t = 0; t < tokens; t += 16) {
      if (r == 0 && pf != nullptr) PrefetchRows(pf, pf_count, t, 16, row_bytes);
      WideLogitsBlock<1, 16, kFp8>(q_eo + r * q_stride, q_stride, 1, k_rows + t, tokens - t,
                                   head_dim, s + r * s_stride + t, s_stride, table);
    }
  }
}

// One row block's PV over the whole head: chunk pairs, then a last single
// chunk where the chunk count is odd. The first pass issues the prefetches.
template <int kRows, bool kFp8, bool kBlocked = false, class Rows = const void* const*>
void WidePvRows(const float* p, int64_t p_stride, int64_t valid_rows, const Rows& v_rows,
                int64_t tokens, int64_t head_dim, float* acc, int64_t acc_stride, const Rows* pf,
                int64_t pf_count, int64_t pf_bytes, const Fp8Table* table,
                const float* alpha = nullptr) {
  int64_t d = 0;
  for (; d + 32 < head_dim; d += 64) {
    WidePvBlock<kRows, 2, kFp8, kBlocked>(p, p_stride, valid_rows, v_rows, tokens, d, head_dim,
                                          acc, acc_stride, d == 0 ? pf : nullptr, pf_count,
                                          pf_bytes, table, alpha);
  }
  if (d < head_dim) {
    WidePvBlock<kRows, 1, kFp8, kBlocked>(p, p_stride, valid_rows, v_rows, tokens, d, head_dim,
                                          acc, acc_stride, d == 0 ? pf : nullptr, pf_count,
                                          pf_bytes, table, alpha);
  }
}

template <bool kFp8>
void WidePvImpl(const float* p, int64_t p_stride, int64_t rows, const void* const* v_rows,
                int64_t tokens, int64_t head_dim, float* acc, int64_t acc_stride,
                const void* const* pf, int64_t pf_count, int64_t pf_bytes,
                const Fp8Table* table) {
  if (pf != nullptr && pf_count > tokens) PrefetchRows(pf, pf_count, tokens, pf_count, pf_bytes);
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    WidePvRows<4, kFp8>(p + r * p_stride, p_stride, 4, v_rows, tokens, head_dim,
                        acc + r * acc_stride, acc_stride, r == 0 && pf != nullptr ? &pf : nullptr,
                        pf_count, pf_bytes, table);
  }
  if (rows - r >= 2) {
    WidePvRows<2, kFp8>(p + r * p_stride, p_stride, 2, v_rows, tokens, head_dim,
                        acc + r * acc_stride, acc_stride, r == 0 && pf != nullptr ? &pf : nullptr,
                        pf_count, pf_bytes, table);
    r += 2;
  }
  if (rows - r == 1) {
    WidePvRows<1, kFp8>(p + r * p_stride, p_stride, 1, v_rows, tokens, head_dim,
                        acc + r * acc_stride, acc_stride, r == 0 && pf != nullptr ? &pf : nullptr,
                        pf_count, pf_bytes, table);
  }
}

// e^x for x <= 0, -inf included, within about an ulp; e^x below e^-87
// (just above the smallest normal float) is 0: it cannot move a sum that
// holds e^0 = 1, and no denormal reaches the products.
RPA_WIDE_TARGET __attribute__((always_inline)) inline __m512 ExpNonPositive(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(-87.0f);
  const __mmask16 normal = _mm512_cmp_ps_mask(x, lowest, _CMP_GE_OQ);
  x = _mm512_max_ps(x, lowest);  // -inf would make the reduced argument NaN.
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // x - n ln2 in two steps (ln2's high part has trailing zeros: n * hi is exact).
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-6f), r);
  // Taylor to degree 7 on |r| <= ln2 / 2: truncation below 1e-8.
  __m512 poly = _mm512_set1_ps(1.0f / 5040);
  for (const float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) {
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(c));
  }
  return _mm512_maskz_scalef_ps(normal, poly, n);
}

// Lane i of the result: the sum (or max) of the four lanes of v's 128-bit
// lane that holds i, i.e. of row i / 4 in a logits block.
RPA_WIDE_TARGET __attribute__((always_inline)) inline __m512 RowMax(__m512 v) {
  v = _mm512_max_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_max_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
}
RPA_WIDE_TARGET __attribute__((always_inline)) inline __m512 RowSum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
}
// Lane r (< 4) of the result: lane 4r of v, one per row.
RPA_WIDE_TARGET __attribute__((always_inline)) inline __m128 PerRow(__m512 v) {
  return _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), v));
}

// A fused decode tile's logits, 4 keys at a time: block(k) gives the scaled
// logits of keys k[0..3] (lane r * 4 + t); they go to w, keys past n as
// -inf, for DecodeTileSoftmax, with their lane-wise maximum in *vmax and
// the lanes that were NaN in *nan. The next tile's K rows are prefetched
// meanwhile (k_next.rows null: none).
template <class Block>
RPA_WIDE_TARGET __attribute__((always_inline)) inline void DecodeTileLogits(
    const OffsetRows& k_rows, int64_t n, const OffsetRows& k_next, int64_t n_next,
    int64_t pf_bytes, const Block& block, float* w, __m512* vmax, __mmask16* nan) {
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  *vmax = neg_inf;
  *nan = 0;
  for (int64_t b = 0; 4 * b < n; ++b) {
    const int64_t t0 = 4 * b, valid = n - t0 < 4 ? n - t0 : 4;
    if (k_next.rows != nullptr) PrefetchRows(k_next, n_next, t0, 4, pf_bytes);
    const void* k[4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) k[t] = k_rows[t0 + (t < valid ? t : 0)];
    __m512 x = block(k);
    *nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __mmask16 keys = static_cast<__mmask16>(((1u << valid) - 1) * 0x1111u);
    x = _mm512_mask_blend_ps(keys, neg_inf, x);
    *vmax = _mm512_max_ps(*vmax, x);
    _mm512_store_ps(w + 16 * b, x);
  }
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
RPA_WIDE_TARGET __attribute__((always_inline)) inline bool DecodeTileSoftmax(
    float* w, int64_t n, __m512 vmax, __mmask16 nan, int64_t rows, const float* m,
    const float* l, DecodeTileState* next) {
  const __mmask8 row_mask = static_cast<__mmask8>((1u << rows) - 1);
  const __mmask16 row_lanes = static_cast<__mmask16>((1u << (4 * rows)) - 1);
  const __m512 m_old = _mm512_permutexvar_ps(
      _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
      _mm512_castps128_ps512(_mm_maskz_loadu_ps(row_mask, m)));
  const __m512 m_new = _mm512_max_ps(m_old, RowMax(vmax));
  const __mmask16 finite = _mm512_mask_cmp_ps_mask(
      row_lanes, _mm512_sub_ps(m_new, m_new), _mm512_setzero_ps(), _CMP_EQ_OQ);
  if ((nan & row_lanes) != 0 || finite != row_lanes ||
      _mm512_mask_cmp_ps_mask(row_lanes, m_old, m_old, _CMP_UNORD_Q) != 0) {
    return false;
  }
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

template <bool kFp8>
RPA_WIDE_TARGET bool WideDecodeTileImpl(const float* q_eo, int64_t q_stride, int64_t rows,
                                        const OffsetRows& k_rows, const OffsetRows& v_rows,
                                        int64_t n, int64_t head_dim, float logit_scale, float* m,
                                        float* l, float* acc, int64_t acc_stride,
                                        const OffsetRows& k_next, const OffsetRows& v_next,
                                        int64_t n_next, int64_t pf_bytes,
                                        const Fp8Table* table) {
  const bool prefetch = k_next.rows != nullptr;
  const Fp8Lut lut = LoadLut(kFp8 ? table : nullptr);
  const __m512 scale = _mm512_set1_ps(logit_scale);
  // Rows past `rows` repeat the last one; nothing of theirs is stored.
  const float* q[4];
  for (int r = 0; r < 4; ++r) q[r] = q_eo + (r < rows ? r : rows - 1) * q_stride;
  // Logits, then weights, in blocks of 4 keys: lane r * 4 + t = (row r, key 4b + t).
  alignas(64) float w[kWideDecodeMaxKeys / 4 * 16];
  __m512 vmax;
  __mmask16 nan;
  DecodeTileLogits(
      k_rows, n, k_next, n_next, pf_bytes,
      [&](const void* const* k) RPA_WIDE_TARGET {
        return _mm512_mul_ps(WideLogitsVector<4, 4, kFp8>(q, k, head_dim, lut), scale);
      },
      w, &vmax, &nan);
  DecodeTileState next;
  if (!DecodeTileSoftmax(w, n, vmax, nan, rows, m, l, &next)) return false;
  next.Commit(rows, m, l);
  WidePvRows<4, kFp8, true>(w, 0, rows, v_rows, n, head_dim, acc, acc_stride,
                            prefetch ? &v_next : nullptr, n_next, pf_bytes, table, next.alpha);
  return true;
}

// ---- 8-bit float decode in f16 arithmetic (AVX512-FP16). An e5m2 code is
// the high byte of its f16; an e4m3fn code's bits moved into an f16 (sign
// to bit 15, the other 7 bits to bits 13-7) are its value times 2^-8
// exactly, subnormals included. That takes 1 or 3 vector ops per 32 codes
// (the bf16 table 7, then the widening 2 more), and vfmadd231ph does 32
// products per instruction where the f32 FMA does 16 (at ~0.8 per cycle
// against the FMA's 2 on the CPU measured, but on one port, leaving the
// other to the conversions and shuffles). No f16 sum can overflow: q is
// scaled by a power of 2 so that a head's products sum to less than 65504
// (QRowToHalf) and, for e5m2, the weights by 2^-5 so that 32 weighted
// values do. The rounding (2^-11 of a partial sum per step, ~10 steps)
// moves a logit by ~4e-4 of its magnitude and an output by ~1e-3 of |V|,
// inside the 8-bit tolerance.

// The elements [d, d + 64) of a row that lie below head_dim.
inline __mmask64 ChunkMask64(int64_t d, int64_t head_dim) {
  const int64_t left = head_dim - d;
  return left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
}

// The largest |logit| (after scaling) that a tile's maximum may have: past
// it the f16 rounding of the dominant logits (~2^-11 of each partial sum)
// would move their weights by more than ~0.6%.
inline constexpr float kHalfMaxLogit = 16.0f;

// The largest magnitude of a code (e4m3fn as stored here, times 2^-8), and
// the weights' scale that keeps a tile's 32 weighted values below 65504.
template <bool kE5m2>
inline constexpr float kHalfCodeMax = kE5m2 ? 57344.0f : 448.0f / 256.0f;
template <bool kE5m2>
inline constexpr float kHalfWeightScale = kE5m2 ? 1.0f / 32 : 1.0f;

// The non-finite codes (e4m3fn 0x7F and 0xFF would come out of CodesToHalf
// finite) are seen at the byte level: *seen keeps each byte's maximum of
// code | (the bits that are not the NaN/inf pattern's), 0xFF once such a
// code went by (SawNonFiniteCode).
template <bool kE5m2>
RPA_WIDE_TARGET __attribute__((always_inline)) inline void SeeCodes(__m512i x, __m512i* seen) {
  const char others = static_cast<char>(kE5m2 ? 0x83 : 0x80);  // e5m2: exponent 11111.
  *seen = _mm512_max_epu8(*seen, _mm512_or_si512(x, _mm512_set1_epi8(others)));
}

// 64 codes as f16 bits, lane-interleaved as the byte unpacks leave them: a
// = elements {0-7, 16-23, 32-39, 48-55}, b = {8-15, 24-31, 40-47, 56-63}
// (QRowToHalf stores q in the same order); the codes are seen (SeeCodes).
template <bool kE5m2>
RPA_WIDE_TARGET __attribute__((always_inline)) inline void CodesToHalf(__m512i x, __m512i* a,
                                                                      __m512i* b, __m512i* seen) {
  SeeCodes<kE5m2>(x, seen);
  const __m512i zero = _mm512_setzero_si512();
  *a = _mm512_unpacklo_epi8(zero, x);  // The code in a word's high byte.
  *b = _mm512_unpackhi_epi8(zero, x);
  if constexpr (!kE5m2) {
    // Arithmetic shift by 1: s s eeee mmm 0000000; then bit 14 cleared.
    const __m512i clear14 = _mm512_set1_epi16(static_cast<short>(0xBFFF));
    *a = _mm512_and_si512(_mm512_srai_epi16(*a, 1), clear14);
    *b = _mm512_and_si512(_mm512_srai_epi16(*b, 1), clear14);
  }
}

RPA_WIDE_TARGET __attribute__((always_inline)) inline bool SawNonFiniteCode(__m512i seen) {
  return _mm512_cmpeq_epi8_mask(seen, _mm512_set1_epi8(-1)) != 0;
}

// The logits of 4 rows x 4 keys (lane r * 4 + t), in f16 with the sums
// finished in f32.
template <bool kE5m2>
RPA_WIDE_TARGET __attribute__((always_inline)) inline __m512 HalfLogitsVector(
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
      CodesToHalf<kE5m2>(_mm512_maskz_loadu_epi8(mask, static_cast<const uint8_t*>(k[t]) + d), &a,
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
// block t / 4. check_rest: also look at the row's codes past this pass, so
// that a NaN or inf code anywhere is seen before the first pass writes acc.
template <int kChunks, bool kE5m2>
RPA_WIDE_TARGET __attribute__((always_inline)) inline bool HalfPvPass(
    const uint32_t* wh, int64_t rows, const OffsetRows& v_rows, int64_t n, int64_t d0,
    int64_t head_dim, const float* alpha, float* acc, int64_t acc_stride,
    const OffsetRows* pf, int64_t pf_count, int64_t pf_bytes, bool check_rest) {
  // Index (c * 2 + h) * 4 + r: chunk c, h = 0 for the a half (b: 1), row r.
  __m512 sum[kChunks * 8];
#pragma GCC unroll 16
  for (int i = 0; i < kChunks * 8; ++i) sum[i] = _mm512_setzero_ps();
  __mmask64 mask[kChunks];
  for (int c = 0; c < kChunks; ++c) mask[c] = ChunkMask64(d0 + 64 * c, head_dim);
  __m512i seen = _mm512_setzero_si512();
  for (int64_t t = 0; t < n; ++t) {
    if (pf != nullptr && t < pf_count) PrefetchRow((*pf)[t], pf_bytes);
    const uint8_t* row = static_cast<const uint8_t*>(v_rows[t]);
    __m512 va[kChunks], vb[kChunks];
#pragma GCC unroll 2
    for (int c = 0; c < kChunks; ++c) {
      __m512i a, b;
      CodesToHalf<kE5m2>(_mm512_maskz_loadu_epi8(mask[c], row + d0 + 64 * c), &a, &b, &seen);
      va[c] = _mm512_castsi512_ps(a);
      vb[c] = _mm512_castsi512_ps(b);
    }
    if (check_rest) {
      for (int64_t d = d0 + 64 * kChunks; d < head_dim; d += 64) {
        SeeCodes<kE5m2>(_mm512_maskz_loadu_epi8(ChunkMask64(d, head_dim), row + d), &seen);
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
  const __m512 unscale = _mm512_set1_ps(1.0f / kHalfWeightScale<kE5m2>);
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
template <bool kE5m2>
RPA_WIDE_TARGET float QRowToHalfImpl(const float* q, int64_t head_dim, uint16_t* out) {
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
                           kHalfCodeMax<kE5m2>),
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

template <bool kE5m2>
RPA_WIDE_TARGET bool HalfDecodeTileImpl(const uint16_t* q_half, int64_t q_stride,
                                        const float* q_unscale, int64_t rows,
                                        const OffsetRows& k_rows, const OffsetRows& v_rows,
                                        int64_t n, int64_t head_dim, float logit_scale, float* m,
                                        float* l, float* acc, int64_t acc_stride,
                                        const OffsetRows& k_next, const OffsetRows& v_next,
                                        int64_t n_next, int64_t pf_bytes) {
  const bool prefetch = k_next.rows != nullptr;
  const uint16_t* q[4];
  alignas(16) float row_scale[4];
  for (int r = 0; r < 4; ++r) {
    const int64_t rr = r < rows ? r : rows - 1;  // Rows past `rows` repeat the last one.
    q[r] = q_half + rr * q_stride;
    row_scale[r] = logit_scale * q_unscale[rr];
  }
  const __m512 scale = _mm512_permutexvar_ps(
      _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
      _mm512_castps128_ps512(_mm_load_ps(row_scale)));
  alignas(64) float w[kWideDecodeMaxKeys / 4 * 16];
  __m512 vmax;
  __mmask16 nan;
  __m512i seen = _mm512_setzero_si512();
  DecodeTileLogits(
      k_rows, n, k_next, n_next, pf_bytes,
      [&](const void* const* k) RPA_WIDE_TARGET {
        return _mm512_mul_ps(HalfLogitsVector<kE5m2>(q, k, head_dim, &seen), scale);
      },
      w, &vmax, &nan);
  // Logits near the row's maximum carry its weight; their f16 error grows
  // with their magnitude (~4e-4 of it here), so a tile whose largest logit
  // is far from 0 (over kHalfMaxLogit either way) is left to f32.
  const __m512 tile_max = _mm512_abs_ps(RowMax(vmax));
  const bool large = _mm512_cmp_ps_mask(tile_max, _mm512_set1_ps(kHalfMaxLogit), _CMP_GT_OQ) != 0;
  DecodeTileState next;
  if (large || SawNonFiniteCode(seen) || !DecodeTileSoftmax(w, n, vmax, nan, rows, m, l, &next)) {
    return false;
  }
  alignas(64) uint32_t wh[kWideDecodeMaxKeys / 4 * 16];
  for (int64_t b = 0; 4 * b < n; ++b) {
    const __m512 p = _mm512_mul_ps(_mm512_load_ps(w + 16 * b),
                                   _mm512_set1_ps(kHalfWeightScale<kE5m2>));
    const __m512i h =
        _mm512_cvtepu16_epi32(_mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm512_store_si512(wh + 16 * b, _mm512_or_si512(h, _mm512_slli_epi32(h, 16)));
  }
  const OffsetRows* pf = prefetch ? &v_next : nullptr;
  int64_t d = 0;
  for (; d + 64 < head_dim; d += 128) {
    if (!HalfPvPass<2, kE5m2>(wh, rows, v_rows, n, d, head_dim, next.alpha, acc, acc_stride,
                              d == 0 ? pf : nullptr, n_next, pf_bytes, d == 0)) {
      return false;
    }
  }
  if (d < head_dim &&
      !HalfPvPass<1, kE5m2>(wh, rows, v_rows, n, d, head_dim, next.alpha, acc, acc_stride,
                            d == 0 ? pf : nullptr, n_next, pf_bytes, d == 0)) {
    return false;
  }
  next.Commit(rows, m, l);
  return true;
}

}  // namespace

void WideLogits(DType k_dtype, const float* q_eo, int64_t q_stride, int64_t rows,
                const void* const* k_rows, int64_t tokens, int64_t head_dim, float* s,
                int64_t s_stride, const void* const* pf, int64_t pf_count, int64_t pf_bytes) {
  if (rows <= 0 || tokens <= 0) return;
  const Fp8Table* table = Fp8TableOf(k_dtype);
  if (table != nullptr) {
    WideLogitsImpl<true>(q_eo, q_stride, rows, k_rows, tokens, head_dim, s, s_stride, pf,
                         pf_count, pf_bytes, table);
  } else {
    WideLogitsImpl<false>(q_eo, q_stride, rows, k_rows, tokens, head_dim, s, s_stride, pf,
                          pf_count, pf_bytes, nullptr);
  }
}

void WidePv(DType v_dtype, const float* p, int64_t p_stride, int64_t rows,
            const void* const* v_rows, int64_t tokens, int64_t head_dim, float* acc,
            int64_t acc_stride, const void* const* pf, int64_t pf_count, int64_t pf_bytes) {
  if (tokens <= 0) return;
  const Fp8Table* table = Fp8TableOf(v_dtype);
  if (table != nullptr) {
    WidePvImpl<true>(p, p_stride, rows, v_rows, tokens, head_dim, acc, acc_stride, pf,
                     pf_count, pf_bytes, table);
  } else {
    WidePvImpl<false>(p, p_stride, rows, v_rows, tokens, head_dim, acc, acc_stride, pf,
                      pf_count, pf_bytes, nullptr);
  }
}

bool WideDecodeTile(DType kv_dtype, const float* q_eo, int64_t q_stride, int64_t rows,
                    const uint8_t* const* k_rows, const uint8_t* const* v_rows,
                    int64_t k_offset, int64_t v_offset, int64_t tokens, int64_t head_dim,
                    float logit_scale, float* m, float* l, float* acc, int64_t acc_stride,
                    const uint8_t* const* k_next, const uint8_t* const* v_next,
                    int64_t next_count, int64_t row_bytes) {
  const OffsetRows k{k_rows, k_offset}, v{v_rows, v_offset};
  const OffsetRows kn{k_next, k_offset}, vn{v_next, v_offset};
  const Fp8Table* table = Fp8TableOf(kv_dtype);
  if (table != nullptr) {
    return WideDecodeTileImpl<true>(q_eo, q_stride, rows, k, v, tokens, head_dim, logit_scale, m, l,
                                    acc, acc_stride, kn, vn, next_count, row_bytes, table);
  }
  return WideDecodeTileImpl<false>(q_eo, q_stride, rows, k, v, tokens, head_dim, logit_scale, m, l,
                                   acc, acc_stride, kn, vn, next_count, row_bytes, nullptr);
}

float QRowToHalf(DType kv_dtype, const float* q, int64_t head_dim, uint16_t* out) {
  return kv_dtype == DType::kF8E5M2 ? QRowToHalfImpl<true>(q, head_dim, out)
                                    : QRowToHalfImpl<false>(q, head_dim, out);
}

bool HalfDecodeTile(DType kv_dtype, const uint16_t* q_half, int64_t q_stride,
                    const float* q_unscale, int64_t rows, const uint8_t* const* k_rows,
                    const uint8_t* const* v_rows, int64_t k_offset, int64_t v_offset,
                    int64_t tokens, int64_t head_dim, float logit_scale, float* m, float* l,
                    float* acc, int64_t acc_stride, const uint8_t* const* k_next,
                    const uint8_t* const* v_next, int64_t next_count, int64_t row_bytes) {
  const OffsetRows k{k_rows, k_offset}, v{v_rows, v_offset};
  const OffsetRows kn{k_next, k_offset}, vn{v_next, v_offset};
  if (kv_dtype == DType::kF8E5M2) {
    return HalfDecodeTileImpl<true>(q_half, q_stride, q_unscale, rows, k, v, tokens, head_dim,
                                    logit_scale, m, l, acc, acc_stride, kn, vn, next_count,
                                    row_bytes);
  }
  return HalfDecodeTileImpl<false>(q_half, q_stride, q_unscale, rows, k, v, tokens, head_dim,
                                   logit_scale, m, l, acc, acc_stride, kn, vn, next_count,
                                   row_bytes);
}

void Fp8RowsToBf16(DType dtype, const void** rows, int64_t tokens, int64_t head_dim,
                   uint16_t* dst, int64_t dst_stride) {
  Fp8RowsToBf16Impl(*Fp8TableOf(dtype), rows, tokens, head_dim, dst, dst_stride);
}

void Bf16Logits(const uint16_t* q_hi, const uint16_t* q_lo, int64_t q_stride, int64_t rows,
                const void* const* k_rows, int64_t tokens, int64_t head_dim, float* s,
                int64_t s_stride, const void* const* prefetch_rows, int64_t prefetch_count) {
  if (rows <= 0 || tokens <= 0) return;
  if (q_lo != nullptr) {
    LogitsImpl<true>(q_hi, q_lo, q_stride, rows, k_rows, tokens, head_dim, s, s_stride,
                     prefetch_rows, prefetch_count);
  } else {
    LogitsImpl<false>(q_hi, nullptr, q_stride, rows, k_rows, tokens, head_dim, s, s_stride,
                      prefetch_rows, prefetch_count);
  }
}

void Bf16AccumulatePV(float* p, int64_t p_stride, int64_t rows, const void* const* v_rows,
                      int64_t tokens, int64_t head_dim, float* acc, int64_t acc_stride,
                      const void* const* prefetch_rows, int64_t prefetch_count) {
  if (tokens <= 0) return;
  const void* const* pf = prefetch_rows;
  if (pf != nullptr && prefetch_count > RoundUp(tokens, 2)) {
    PrefetchRows(pf, prefetch_count, RoundUp(tokens, 2), prefetch_count, head_dim * 2);
  }
  // Pack each row's weights in place into bf16 pairs (key 2i low, 2i + 1
  // high): the weights are bf16-exact f32, so their high halves are the bf16.
  // Done once per tile instead of once per 32-dim chunk.
  for (int64_t r = 0; r < rows; ++r) {
    float* row = p + r * p_stride;
    uint32_t* packed = reinterpret_cast<uint32_t*>(row);
    for (int64_t i = 0; i < tokens; i += 2) {
      uint32_t p0, p1 = 0;
      std::memcpy(&p0, row + i, 4);
      if (i + 1 < tokens) std::memcpy(&p1, row + i + 1, 4);
      packed[i / 2] = (p0 >> 16) | (p1 & 0xFFFF0000u);
    }
  }
  const uint32_t* p2 = reinterpret_cast<const uint32_t*>(p);
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    PvBlock<4>(p2 + r * p_stride, p_stride, 4, v_rows, tokens, head_dim, acc + r * acc_stride,
               acc_stride, r == 0 ? pf : nullptr, prefetch_count);
  }
  if (rows - r >= 2) {
    PvBlock<2>(p2 + r * p_stride, p_stride, 2, v_rows, tokens, head_dim, acc + r * acc_stride,
               acc_stride, r == 0 ? pf : nullptr, prefetch_count);
    r += 2;
  }
  if (rows - r == 1) {
    PvBlock<1>(p2 + r * p_stride, p_stride, 1, v_rows, tokens, head_dim, acc + r * acc_stride,
               acc_stride, r == 0 ? pf : nullptr, prefetch_count);
  }
}

#else  // !RPA_HAVE_X86

bool CpuHasAvx512Bf16() { return false; }
bool CpuHasAvx512Bw() { return false; }
bool CpuHasAvx512Fp16() { return false; }
float QRowToHalf(DType, const float*, int64_t, uint16_t*) { return 1.0f; }
bool HalfDecodeTile(DType, const uint16_t*, int64_t, const float*, int64_t, const uint8_t* const*,
                    const uint8_t* const*, int64_t, int64_t, int64_t, int64_t, float, float*,
                    float*, float*, int64_t, const uint8_t* const*, const uint8_t* const*,
                    int64_t, int64_t) {
  return false;
}
void WideLogits(DType, const float*, int64_t, int64_t, const void* const*, int64_t, int64_t,
                float*, int64_t, const void* const*, int64_t, int64_t) {}
bool WideDecodeTile(DType, const float*, int64_t, int64_t, const uint8_t* const*,
                    const uint8_t* const*, int64_t, int64_t, int64_t, int64_t, float, float*,
                    float*, float*, int64_t, const uint8_t* const*, const uint8_t* const*,
                    int64_t, int64_t) {
  return false;
}
void WidePv(DType, const float*, int64_t, int64_t, const void* const*, int64_t, int64_t,
            float*, int64_t, const void* const*, int64_t, int64_t) {}
void Fp8RowsToBf16(DType, const void**, int64_t, int64_t, uint16_t*, int64_t) {}
void Bf16Logits(const uint16_t*, const uint16_t*, int64_t, int64_t, const void* const*, int64_t,
                int64_t, float*, int64_t, const void* const*, int64_t) {}
void Bf16AccumulatePV(float*, int64_t, int64_t, const void* const*, int64_t, int64_t,
                      float*, int64_t, const void* const*, int64_t) {}

#endif  // RPA_HAVE_X86

}  // namespace rpa::internal
