// K/V tiles and softmax weights in bf16 pairs: the VNNI layouts both
// bf16-pair prefill kernels multiply (amx_prefill's tdpbf16ps tiles,
// avx512_bf16_packed's vdpbf16ps), packed by AVX-512 BF16 code; none needs
// AMX. K/V rows of dtype bf16, fp8 e4m3fn, fp8 e5m2 or int8 are converted to
// bf16 exactly (e4m3fn at its true value, no rescale; NaN codes stay NaN),
// each row read for head_dim elements only (masked loads): nothing past it.
// x86-64 only; call only where the CPU has AVX-512 BF16.
#ifndef RPA_SRC_KERNEL_BF16_PAIRS_H_
#define RPA_SRC_KERNEL_BF16_PAIRS_H_

#if defined(__x86_64__)
#include <cstdint>

#include "kernel/tile_kernel.h"
#include "rpa/dtype.h"

namespace rpa::internal {

inline constexpr int64_t kAmxKeyAlign = 32;   // Keys of a packed K or V tile.
inline constexpr int64_t kAmxDimAlign = 32;   // Dims of q and of packed K.
inline constexpr int64_t kAmxVDimAlign = 16;  // Dims of packed V; acc columns computed.

inline int64_t AmxRoundUp(int64_t x, int64_t align) { return (x + align - 1) / align * align; }

// ---- Sizes (elements of uint16_t) of the buffers the caller provides.
// AmxPackKeys' output: [RoundUp(head_dim, 32) / 2][RoundUp(n, 32)][2] bf16.
inline int64_t AmxPackedKeysElems(int64_t n, int64_t head_dim) {
  return AmxRoundUp(head_dim, kAmxDimAlign) * AmxRoundUp(n, kAmxKeyAlign);
}
// AmxPackValues' output: [RoundUp(n, 32) / 2][RoundUp(head_dim, 16)][2] bf16.
inline int64_t AmxPackedValuesElems(int64_t n, int64_t head_dim) {
  return AmxRoundUp(n, kAmxKeyAlign) * AmxRoundUp(head_dim, kAmxVDimAlign);
}
// AmxWeightsToBf16's output: [RoundUp(rows, 16)][RoundUp(n, 32)] bf16.
inline int64_t AmxPvScratchElems(int64_t rows, int64_t n) {
  return AmxRoundUp(rows, 16) * AmxRoundUp(n, kAmxKeyAlign);
}

struct AmxPackArgs {
  DType dtype = DType::kBF16;
  const void* const* rows = nullptr;  // [n] pointers to head_dim elements.
  int64_t n = 0;                      // 1..any keys.
  int64_t head_dim = 0;               // 1..256 (any, in fact).
  uint16_t* out = nullptr;            // AmxPackedKeysElems / AmxPackedValuesElems.
};
// out[(d / 2) * 2 * n32 + 2 * i + d % 2] = k_i[d], n32 = RoundUp(n, 32):
// [RoundUp(head_dim, 32) / 2][n32][2], zero for d >= head_dim or i >= n.
void AmxPackKeys(const AmxPackArgs& args);
// out[(i / 2) * 2 * d16 + 2 * d + i % 2] = v_i[d], d16 = RoundUp(head_dim,
// 16): [n32 / 2][d16][2], zero for i >= n (so zero weights never meet NaN)
// or d >= head_dim.
void AmxPackValues(const AmxPackArgs& args);

// p_bf16 [RoundUp(rows, 16)][RoundUp(n, 32)] = bf16(p), nearest even, zero
// for keys >= n and rows >= rows; p's columns >= n are not read.
void AmxWeightsToBf16(const float* p, int64_t p_stride, int64_t rows, int64_t n,
                      uint16_t* p_bf16);

// A tile's packs side by side in TileScratch::packed, K's then V's:
// [dim_pad / 2][n32][2] and [n32 / 2][d16][2] bf16, n32 = RoundUp(n, 32)
// (2 x n32 x dim_pad bf16 at most: the buffer's n32 x dim_pad f32).
inline uint16_t* PackedTileKeys(const TileScratch& scratch) {
  return reinterpret_cast<uint16_t*>(scratch.packed);
}
inline uint16_t* PackedTileValues(const KvTile& tile, const TileScratch& scratch) {
  return PackedTileKeys(scratch) + AmxRoundUp(tile.n, kAmxKeyAlign) * scratch.dim_pad;
}

// The kernels' tile step (their ProductKernel::prepare_tile), each instance
// for K/V of kDtype (bf16, e4m3fn, e5m2 or int8): the tile's K rows packed
// as AmxPackKeys packs them at PackedTileKeys, its V rows as AmxPackValues
// does at PackedTileValues, once for all the tile's row chunks. With kNext
// = kUpFront the next tile's rows (KvTile::k_next, v_next) are prefetched
// first (avx512_bf16_packed, tuned on Zen 5); amx_prefill takes kNone
// (NextTilePrefetch, tile_kernel.h). The packs' own prefetch
// kPackRowsAhead rows ahead (bf16_pairs.cc) runs in both.
template <DType kDtype, NextTilePrefetch kNext>
struct TilePacks {
  static void KeysAndValues(const KvTile& tile, const TileScratch& scratch);
};
#define RPA_DECLARE_TILE_PACKS(kNext)                                  \
  extern template struct TilePacks<DType::kBF16, kNext>;              \
  extern template struct TilePacks<DType::kF8E4M3FN, kNext>;          \
  extern template struct TilePacks<DType::kF8E5M2, kNext>;            \
  extern template struct TilePacks<DType::kI8, kNext>;
RPA_DECLARE_TILE_PACKS(NextTilePrefetch::kUpFront)
RPA_DECLARE_TILE_PACKS(NextTilePrefetch::kNone)
#undef RPA_DECLARE_TILE_PACKS

// The softmax's f32 weights p as bf16 in place (AmxWeightsToBf16's layout,
// [RoundUp(p.rows, 16)][RoundUp(n, 32)] over p's rows): row r's bf16 end
// before row r + 1's f32 begin (p.stride >= 16), and each chunk is read
// before its bf16, at or below it, is stored. Returns the bf16 rows.
const uint16_t* WeightsToBf16InPlace(const TileLogits& p, int64_t n);

}  // namespace rpa::internal

#endif  // __x86_64__
#endif  // RPA_SRC_KERNEL_BF16_PAIRS_H_
