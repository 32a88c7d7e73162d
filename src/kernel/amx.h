// Intel AMX building blocks for the attention kernel: detection and the
// per-process tile permission, the per-thread tile configuration, the K/V
// packs into the VNNI pair layouts, and the two products of a task's rows
// over one KV tile of one kv head, bf16 in, f32 out:
//   S = Q K^T    (AmxLogits: A = q rows, B = K packed by AmxPackKeys)
//   O += P V     (AmxPv:     A = P as bf16, B = V packed by AmxPackValues)
// The online softmax between them stays with the caller (AVX-512).
//
// Tiles: one palette-1 configuration, every tile 16 rows x 64 bytes (A: 16
// rows x 32 bf16; B: 16 pair rows x 16 columns x 2 bf16; C: 16 x 16 f32),
// so a thread loads it once and keeps it (thread_local). Products are
// blocked 2 A x 2 B -> 4 C tiles (32 rows x 32 keys or dims), with single
// tiles at the odd edges.
//
// Row tails: tiles always have 16 rows, so the q, s and acc buffers must
// have RoundUp(rows, 16) rows allocated: rows [rows, RoundUp(rows, 16)) of
// q are read (any finite or NaN values: rows never mix), and the same rows
// of s and acc are written with garbage. Key and dimension tails are zero
// in the packed layouts, so they contribute exact zeros.
//
// Alignment: none required; 64-byte aligned buffers and strides that are
// multiples of 64 bytes keep every tile row in one cache line.
//
// Everything but AmxSupport() exists on x86-64 only. Call the products,
// packs and the peak probe only where AmxSupport().usable (the packs and
// the emulated backend need AVX-512 BF16 only: CpuHasAvx512Bf16()).
#ifndef RPA_SRC_KERNEL_AMX_H_
#define RPA_SRC_KERNEL_AMX_H_

#include <cstdint>
#include <string>

#include "kernel/tile_kernel.h"
#include "rpa/dtype.h"

namespace rpa::internal {

struct AmxStatus {
  bool usable = false;
  std::string reason;  // "AMX bf16 tiles usable", or which step failed.
};

// CPUID (amx-tile, amx-bf16, avx512f/bw/vl, avx512-bf16), OSXSAVE and XCR0
// (tile config + data, opmask/zmm state), then one arch_prctl(
// ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) for the process. Computed once
// (thread-safe static); every thread may use the tiles afterwards.
const AmxStatus& AmxSupport();

#if defined(__x86_64__)

inline constexpr int64_t kAmxTileRows = 16;  // Rows of an A or C tile.
inline constexpr int64_t kAmxKeyAlign = 32;  // Keys of a packed K or V tile.
inline constexpr int64_t kAmxDimAlign = 32;  // Dims of q and of packed K.
inline constexpr int64_t kAmxVDimAlign = 16;  // Dims of packed V; acc columns computed.

inline int64_t AmxRoundUp(int64_t x, int64_t align) { return (x + align - 1) / align * align; }

// Which tile unit runs the products: the hardware, or a scalar emulation of
// the same tile program (same layouts, configuration checks and glue; any
// CPU with AVX-512 BF16) so tests check the blocking where AMX is absent.
enum class AmxBackend : uint8_t { kHardware, kEmulated };

// ---- Sizes (elements of uint16_t) of the buffers the caller provides.
// AmxPackKeys' output: [RoundUp(head_dim, 32) / 2][RoundUp(n, 32)][2] bf16.
inline int64_t AmxPackedKeysElems(int64_t n, int64_t head_dim) {
  return AmxRoundUp(head_dim, kAmxDimAlign) * AmxRoundUp(n, kAmxKeyAlign);
}
// AmxPackValues' output: [RoundUp(n, 32) / 2][RoundUp(head_dim, 16)][2] bf16.
inline int64_t AmxPackedValuesElems(int64_t n, int64_t head_dim) {
  return AmxRoundUp(n, kAmxKeyAlign) * AmxRoundUp(head_dim, kAmxVDimAlign);
}
// AmxPv's weight scratch: [RoundUp(rows, 16)][RoundUp(n, 32)] bf16.
inline int64_t AmxPvScratchElems(int64_t rows, int64_t n) {
  return AmxRoundUp(rows, kAmxTileRows) * AmxRoundUp(n, kAmxKeyAlign);
}
// All three for a task of `rows` rows and tiles of up to kv_block keys, each
// buffer rounded to 64 bytes (the plan's per-worker AMX scratch; q, s, acc,
// m and l are the kernel's own, with RoundUp(rows, 16) rows).
inline int64_t AmxScratchBytes(int64_t rows, int64_t kv_block, int64_t head_dim) {
  return AmxRoundUp(2 * AmxPackedKeysElems(kv_block, head_dim), 64) +
         AmxRoundUp(2 * AmxPackedValuesElems(kv_block, head_dim), 64) +
         AmxRoundUp(2 * AmxPvScratchElems(rows, kv_block), 64);
}

// ---- Packs (AVX-512; no tiles). K/V rows of dtype bf16, fp8 e4m3fn, fp8
// e5m2 or int8, converted to bf16 exactly (e4m3fn at its true value, no
// rescale; NaN codes stay NaN). Each row is read for head_dim elements only
// (masked loads): nothing past it.
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

// ---- Products.
struct AmxLogitsArgs {
  // [RoundUp(rows, 16)][q_stride] bf16, q_stride >= RoundUp(head_dim, 32);
  // dims [head_dim, RoundUp(head_dim, 32)) of rows < rows zero (finite).
  const uint16_t* q = nullptr;
  int64_t q_stride = 0;
  int64_t rows = 0;  // 1..any (a prefill task: ~512).
  const uint16_t* k_packed = nullptr;  // AmxPackKeys of n keys, head_dim dims.
  int64_t n = 0;
  int64_t head_dim = 0;
  // [RoundUp(rows, 16)][s_stride], s_stride >= RoundUp(n, 16): columns
  // [n, RoundUp(n, 16)) and rows >= rows get garbage (zero products / q's
  // padding rows).
  float* s = nullptr;
  int64_t s_stride = 0;
  // Add to s's values (all of [RoundUp(rows, 16)][RoundUp(n, 16)]) instead
  // of overwriting them: q = hi + lo in bf16 for f32/f16 q is two calls.
  bool accumulate = false;
};
// s[r * s_stride + i] (+)= q_r . k_i (f32 sum of exact bf16 products) for r
// < rows, i < n. No scratch. Uses tiles 0-7 (reconfigures if needed).
void AmxLogits(const AmxLogitsArgs& args, AmxBackend backend = AmxBackend::kHardware);

struct AmxPvArgs {
  const float* p = nullptr;  // [rows][p_stride] f32 weights; columns [0, n) read.
  int64_t p_stride = 0;
  int64_t rows = 0;
  const uint16_t* v_packed = nullptr;  // AmxPackValues of n keys, head_dim dims.
  int64_t n = 0;
  int64_t head_dim = 0;
  // [RoundUp(rows, 16)][acc_stride] f32, natural dimension order,
  // acc_stride >= RoundUp(head_dim, 16); columns [head_dim, RoundUp(head_dim,
  // 16)) get += 0, rows >= rows are loaded and stored back (+= 0).
  float* acc = nullptr;
  int64_t acc_stride = 0;
  uint16_t* p_bf16 = nullptr;  // Scratch: AmxPvScratchElems(rows, n) elements.
};
// acc[r * acc_stride + d] += sum_{i < n} bf16(p[r * p_stride + i]) * v_i[d]
// for r < rows, d < head_dim; bf16() rounds to nearest even (vcvtne2ps2bf16:
// f32 subnormal weights flush to zero). p is not modified.
void AmxPv(const AmxPvArgs& args, AmxBackend backend = AmxBackend::kHardware);

// AmxPv's two halves, for a softmax that writes bf16 weights itself (and so
// saves AmxPv's pass over p: 512 x 256 f32 weights are 512 KiB).
// p_bf16 [RoundUp(rows, 16)][RoundUp(n, 32)] = bf16(p), nearest even, zero
// for keys >= n and rows >= rows; p's columns >= n are not read. AVX-512.
void AmxWeightsToBf16(const float* p, int64_t p_stride, int64_t rows, int64_t n,
                      uint16_t* p_bf16);
struct AmxPvBf16Args {
  // [RoundUp(rows, 16)][p_stride] bf16, p_stride >= RoundUp(n, 32); keys
  // [n, RoundUp(n, 32)) finite (zero); rows >= rows reach only acc's rows
  // >= rows.
  const uint16_t* p_bf16 = nullptr;
  int64_t p_stride = 0;
  int64_t rows = 0;
  const uint16_t* v_packed = nullptr;  // AmxPackValues of n keys, head_dim dims.
  int64_t n = 0;
  int64_t head_dim = 0;
  float* acc = nullptr;  // As in AmxPvArgs.
  int64_t acc_stride = 0;
};
// acc[r * acc_stride + d] += sum_{i < n} p_bf16[r * p_stride + i] * v_i[d].
void AmxPvBf16(const AmxPvBf16Args& args, AmxBackend backend = AmxBackend::kHardware);

// ---- Decode option: S^T = K Q^T for one query token's g = 1..32 q heads
// of a kv head. The A operand is 16 keys x 32 dims; for bf16 K with
// head_dim % 32 == 0 and 16 keys equally far apart (one page), it is
// loaded straight from the cache rows (stride = their distance, no
// repack); other blocks (a tile's last keys, rows across pages, dim tails,
// 8-bit K) are converted into scratch first. The B operand is Q^T, packed
// once per task by AmxPackQt. Uses its own tile configuration per g (one
// ldtilecfg when a thread switches between decode and AmxLogits/AmxPv).
// Not yet timed on an AMX CPU: dispatch to it once rpa_amx_bench's
// BM_DecodeLogits shows it beating WideLogits there.
// Q^T: [RoundUp(head_dim, 32) / 2][g][2] bf16.
inline int64_t AmxPackedQtElems(int64_t g, int64_t head_dim) {
  return AmxRoundUp(head_dim, kAmxDimAlign) * g;
}
// Scratch of AmxDecodeLogitsT: two converted key blocks, [2][16][RoundUp(
// head_dim, 32)] bf16.
inline int64_t AmxDecodeScratchElems(int64_t head_dim) {
  return 2 * kAmxTileRows * AmxRoundUp(head_dim, kAmxDimAlign);
}
// out = Q^T of q's g rows ([g][q_stride] bf16, head_dim used), zero for
// dims >= head_dim. Plain C++.
void AmxPackQt(const uint16_t* q, int64_t q_stride, int64_t g, int64_t head_dim, uint16_t* out);

struct AmxDecodeLogitsArgs {
  DType dtype = DType::kBF16;           // K: bf16, e4m3fn, e5m2 or int8.
  const void* const* k_rows = nullptr;  // [n] cache rows, head_dim elements read.
  int64_t n = 0;
  int64_t head_dim = 0;
  const uint16_t* qt = nullptr;  // AmxPackQt of g rows.
  int64_t g = 0;                 // 1..32.
  float* st = nullptr;           // [RoundUp(n, 16)][st_stride >= g] f32.
  int64_t st_stride = 0;
  uint16_t* scratch = nullptr;  // AmxDecodeScratchElems(head_dim) elements.
};
// st[i * st_stride + j] = q_j . k_i for i < n, j < g; rows [n, RoundUp(n,
// 16)) of st get zeros, columns >= g are not written.
void AmxDecodeLogitsT(const AmxDecodeLogitsArgs& args, AmxBackend backend = AmxBackend::kHardware);

// For the kernels that multiply bf16 pairs (amx_prefill, avx512_bf16_packed;
// AVX-512 BF16 code), each instance for K/V of kDtype (bf16, e4m3fn, e5m2 or
// int8): the tile's K (or V) rows packed as AmxPackKeys (or AmxPackValues)
// packs them into scratch.packed, after prefetching the next tile's rows;
// returns the packed tile.
template <DType kDtype>
struct TilePacks {
  static const uint16_t* Keys(const KvTile& tile, const TileScratch& scratch);
  static const uint16_t* Values(const KvTile& tile, const TileScratch& scratch);
};
extern template struct TilePacks<DType::kBF16>;
extern template struct TilePacks<DType::kF8E4M3FN>;
extern template struct TilePacks<DType::kF8E5M2>;
extern template struct TilePacks<DType::kI8>;
// The softmax's f32 weights p as bf16 in place (AmxWeightsToBf16's layout,
// [RoundUp(p.rows, 16)][RoundUp(n, 32)] over p's rows): row r's bf16 end
// before row r + 1's f32 begin (p.stride >= 16), and each chunk is read
// before its bf16, at or below it, is stored. Returns the bf16 rows.
const uint16_t* WeightsToBf16InPlace(const TileLogits& p, int64_t n);

// tilerelease: returns the thread's tiles to their init state (the kernel
// then skips saving ~8 KiB of tile data on context switches) and forgets
// the thread's current configuration, so the next product reloads it. The
// thread pool calls this before a worker sleeps; also call it after other
// code on the thread (oneDNN) configured tiles. Hardware only.
void AmxReleaseTiles();

// The machine limit of one thread: 6 independent C tiles, tdpbf16ps on full
// 16x16x32 tiles back to back for about `seconds`. GFLOP/s (2 * 16 * 16 *
// 32 per instruction); 0 where AmxSupport() is not usable.
double AmxBf16PeakGflops(double seconds);

#endif  // defined(__x86_64__)

}  // namespace rpa::internal

#endif  // RPA_SRC_KERNEL_AMX_H_
