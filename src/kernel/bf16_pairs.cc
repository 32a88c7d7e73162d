// The bf16-pair packs (bf16_pairs.h): K/V row chunks converted to bf16 in
// registers (RowReader), transposed or interleaved into the VNNI layouts.
#include "kernel/bf16_pairs.h"

#if defined(__x86_64__)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernel/avx512_common.h"

namespace rpa::internal {
namespace {

// pb [rows16][n32] = bf16(p) (nearest even), zero for keys >= n and rows
// >= rows; p's columns >= n are not read.
RPA_AVX512_BF16_TARGET void WeightsToBf16(const float* p, int64_t p_stride, int64_t rows, int64_t n,
                                uint16_t* pb) {
  const int64_t rows16 = AmxRoundUp(rows, 16), n32 = AmxRoundUp(n, kAmxKeyAlign);
  for (int64_t r = 0; r < rows16; ++r) {
    uint16_t* out = pb + r * n32;
    if (r >= rows) {
      std::memset(out, 0, 2 * n32);
      continue;
    }
    const float* row = p + r * p_stride;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      const __m512 lo = _mm512_loadu_ps(row + i), hi = _mm512_loadu_ps(row + i + 16);
      _mm512_storeu_si512(out + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
    }
    for (; i < n32; i += 32) {
      const __m512 lo = _mm512_maskz_loadu_ps(avx512::Lanes16(n - i), row + i);
      const __m512 hi = _mm512_maskz_loadu_ps(avx512::Lanes16(n - i - 16), row + i + 16);
      _mm512_storeu_si512(out + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
    }
  }
}

// The packs prefetch the rows they read kPackRowsAhead rows ahead, into L1:
// a tile's rows are a token apart (4 KiB in the combined layout), a stride
// the hardware prefetchers do not follow, and the next tile's rows that
// PackTile prefetches up front into L2 (NextTilePrefetch::kUpFront) do not
// all stay there beside a prefill tile's logits (docs/kernel_log.md,
// twelfth session).
constexpr int64_t kPackRowsAhead = 16;

template <DType kDtype>
__attribute__((always_inline)) inline void PrefetchPackRows(const AmxPackArgs& a, int64_t begin,
                                                            int64_t end) {
  const int64_t bytes = a.head_dim * static_cast<int64_t>(SizeOf(kDtype));
  for (int64_t i = begin; i < end && i < a.n; ++i) PrefetchRow(a.rows[i], bytes, PrefetchTo::kL1);
}

// Blocks of 16 keys x 32 dims: 16 row chunks (16 dim pairs each) transposed
// into 16 pair rows of 16 keys, each stored as one 64-byte vector.
template <DType kDtype>
RPA_AVX512_BF16_TARGET void PackKeysImpl(const AmxPackArgs& a) {
  const avx512::RowReader<kDtype> read(a.head_dim);
  const int64_t n32 = AmxRoundUp(a.n, kAmxKeyAlign);
  const int64_t dim_pad = AmxRoundUp(a.head_dim, kAmxDimAlign);
  for (int64_t i0 = 0; i0 < n32; i0 += 16) {
    PrefetchPackRows<kDtype>(a, i0 + kPackRowsAhead, i0 + kPackRowsAhead + 16);
    for (int64_t d0 = 0; d0 < dim_pad; d0 += 32) {
      __m512i v[16];
      for (int64_t j = 0; j < 16; ++j) {
        v[j] = i0 + j < a.n ? read(a.rows[i0 + j], d0) : _mm512_setzero_si512();
      }
      avx512::Transpose16x16(v);
      uint16_t* out = a.out + (d0 / 2) * 2 * n32 + 2 * i0;
      for (int64_t t = 0; t < 16; ++t) _mm512_storeu_si512(out + t * 2 * n32, v[t]);
    }
  }
}

// Key pairs: rows 2 i and 2 i + 1 interleaved element by element (vpermt2w)
// into one pair row of d16 dims.
template <DType kDtype>
RPA_AVX512_BF16_TARGET void PackValuesImpl(const AmxPackArgs& a) {
  const avx512::RowReader<kDtype> read(a.head_dim);
  const int64_t n32 = AmxRoundUp(a.n, kAmxKeyAlign);
  const int64_t d16 = AmxRoundUp(a.head_dim, kAmxVDimAlign);
  alignas(64) uint16_t idx_lo[32], idx_hi[32];
  for (int e = 0; e < 16; ++e) {
    idx_lo[2 * e] = static_cast<uint16_t>(e);
    idx_lo[2 * e + 1] = static_cast<uint16_t>(32 + e);
    idx_hi[2 * e] = static_cast<uint16_t>(16 + e);
    idx_hi[2 * e + 1] = static_cast<uint16_t>(48 + e);
  }
  const __m512i lo_index = _mm512_load_si512(idx_lo), hi_index = _mm512_load_si512(idx_hi);
  for (int64_t i = 0; i < n32; i += 2) {
    uint16_t* out = a.out + i * d16;  // Pair row i / 2: 2 * d16 elements.
    if (i >= a.n) {
      std::memset(out, 0, 4 * d16);
      continue;
    }
    PrefetchPackRows<kDtype>(a, i + kPackRowsAhead, i + kPackRowsAhead + 2);
    for (int64_t d0 = 0; d0 < d16; d0 += 32) {
      const __m512i x = read(a.rows[i], d0);
      const __m512i y = i + 1 < a.n ? read(a.rows[i + 1], d0) : _mm512_setzero_si512();
      _mm512_storeu_si512(out + 2 * d0, _mm512_permutex2var_epi16(x, lo_index, y));
      if (d0 + 16 < d16) {
        _mm512_storeu_si512(out + 2 * d0 + 32, _mm512_permutex2var_epi16(x, hi_index, y));
      }
    }
  }
}

template <template <DType> class Fn>
void DispatchDtype(const AmxPackArgs& a) {
  switch (a.dtype) {
    case DType::kBF16: Fn<DType::kBF16>::Run(a); return;
    case DType::kF8E4M3FN: Fn<DType::kF8E4M3FN>::Run(a); return;
    case DType::kF8E5M2: Fn<DType::kF8E5M2>::Run(a); return;
    case DType::kI8: Fn<DType::kI8>::Run(a); return;
    default:
      std::fprintf(stderr, "AmxPack: K/V dtype %s is not exact in bf16\n",
                   std::string(ToString(a.dtype)).c_str());
      std::abort();
  }
}
template <DType kDtype>
struct PackKeysFn {
  static void Run(const AmxPackArgs& a) { PackKeysImpl<kDtype>(a); }
};
template <DType kDtype>
struct PackValuesFn {
  static void Run(const AmxPackArgs& a) { PackValuesImpl<kDtype>(a); }
};

}  // namespace

void AmxPackKeys(const AmxPackArgs& args) {
  if (args.n > 0 && args.head_dim > 0) DispatchDtype<PackKeysFn>(args);
}

void AmxPackValues(const AmxPackArgs& args) {
  if (args.n > 0 && args.head_dim > 0) DispatchDtype<PackValuesFn>(args);
}

void AmxWeightsToBf16(const float* p, int64_t p_stride, int64_t rows, int64_t n,
                      uint16_t* p_bf16) {
  if (rows > 0 && n > 0) WeightsToBf16(p, p_stride, rows, n, p_bf16);
}

namespace {

// rows (after prefetching the next tile's, `next`, where kNext says so)
// packed by kPack at out.
template <DType kDtype, void (*kPack)(const AmxPackArgs&), NextTilePrefetch kNext>
void PackTile(const KvRows& rows, const KvRows& next, const KvTile& tile,
              const TileScratch& scratch, uint16_t* out) {
  if constexpr (kNext == NextTilePrefetch::kUpFront) {
    PrefetchRows(next, 0, next.count, tile.row_bytes);
  }
  if (tile.n > 0 && tile.head_dim > 0) {
    for (int64_t i = 0; i < rows.count; ++i) scratch.row_pointers[i] = rows[i];
    kPack({kDtype, scratch.row_pointers, tile.n, tile.head_dim, out});
  }
}

}  // namespace

template <DType kDtype, NextTilePrefetch kNext>
void TilePacks<kDtype, kNext>::KeysAndValues(const KvTile& tile, const TileScratch& scratch) {
  static_assert(kAmxDimAlign == kDimAlign && kAmxVDimAlign <= kDimAlign);
  PackTile<kDtype, PackKeysImpl<kDtype>, kNext>(tile.k, tile.k_next, tile, scratch,
                                                 PackedTileKeys(scratch));
  PackTile<kDtype, PackValuesImpl<kDtype>, kNext>(tile.v, tile.v_next, tile, scratch,
                                                   PackedTileValues(tile, scratch));
}

#define RPA_DEFINE_TILE_PACKS(kNext)                           \
  template struct TilePacks<DType::kBF16, kNext>;             \
  template struct TilePacks<DType::kF8E4M3FN, kNext>;         \
  template struct TilePacks<DType::kF8E5M2, kNext>;           \
  template struct TilePacks<DType::kI8, kNext>;
RPA_DEFINE_TILE_PACKS(NextTilePrefetch::kUpFront)
RPA_DEFINE_TILE_PACKS(NextTilePrefetch::kNone)
#undef RPA_DEFINE_TILE_PACKS

const uint16_t* WeightsToBf16InPlace(const TileLogits& p, int64_t n) {
  uint16_t* weights = reinterpret_cast<uint16_t*>(p.s);
  AmxWeightsToBf16(p.s, p.stride, p.rows, n, weights);
  return weights;
}

}  // namespace rpa::internal

#endif  // __x86_64__
