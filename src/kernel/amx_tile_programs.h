// The AMX tile programs (amx.h's products), written once over a tile unit
// `Tiles`: HwTiles here (the hardware's eight tiles), or the scalar tile
// model testing/amx_emulation.h has for CPUs without AMX, so the blocking
// and layouts are tested there. A tile unit has Configure(id, config),
// Load<t>(base, stride), Store<t>, Zero<t> and Dp<c, a, b> (C += A B).
//
// No file-wide -m flag: every function that runs an AVX-512 instruction has
// a target attribute, and the tile instructions are inline assembly (GCC
// 12's AMX intrinsics are macros that want literal tile numbers and have no
// memory clobber; Clang 14's builtins differ): here each tile instruction
// takes its tile numbers as template constants ("i" operands printed with
// %c) and its memory effects as a "memory" clobber, so a buffer filled just
// before is stored before the tile load reads it, in either compiler. Both
// assemblers take the mnemonics whatever the function's target. x86-64
// only; for amx_tiles.cc and testing/.
#ifndef RPA_SRC_KERNEL_AMX_TILE_PROGRAMS_H_
#define RPA_SRC_KERNEL_AMX_TILE_PROGRAMS_H_

#if defined(__x86_64__)
#include <cstdint>

#include "kernel/amx.h"
#include "kernel/avx512_common.h"
#include "kernel/bf16_pairs.h"

#define RPA_AMX_GLUE RPA_AVX512_BF16_TARGET
#define RPA_AMX_INLINE __attribute__((always_inline)) inline

namespace rpa::internal::amx {

// ---- The tile configuration (palette 1): byte 0 palette, 16-31 bytes per
// row of tiles 0-15, 48-63 rows of tiles 0-15.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Configuration ids kept per thread (0: none loaded, or released).
constexpr int kConfigFull = 1;

// Every tile 16 rows x 64 bytes: A 16 x 32 bf16, B 16 pair rows x 16 x 2
// bf16, C 16 x 16 f32. All products and the peak probe use this one.
constexpr TileConfig FullConfig() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  return c;
}
constexpr TileConfig kFullConfig = FullConfig();

// ---- The hardware's tiles.
struct HwTiles {
  static inline thread_local int config_id = 0;

  static RPA_AMX_INLINE void Configure(int id, const TileConfig& config) {
    if (config_id == id) return;
    __asm__ volatile("ldtilecfg %0" ::"m"(config));
    config_id = id;
  }
  template <int kT>
  static RPA_AMX_INLINE void Load(const void* base, int64_t stride_bytes) {
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride_bytes), "i"(kT)
                     : "memory");
  }
  template <int kT>
  static RPA_AMX_INLINE void Store(void* base, int64_t stride_bytes) {
    __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride_bytes), "i"(kT)
                     : "memory");
  }
  template <int kT>
  static RPA_AMX_INLINE void Zero() {
    __asm__ volatile("tilezero %%tmm%c0" ::"i"(kT));
  }
  // C += A B (AT&T order: B, A, C).
  template <int kC, int kA, int kB>
  static RPA_AMX_INLINE void Dp() {
    __asm__ volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(kC), "i"(kA), "i"(kB));
  }
  static void Release() {
    __asm__ volatile("tilerelease" ::: "memory");
    config_id = 0;
  }
};

// ---- A block's C tiles 0-3: C[i][j] = tile 2 i + j (i < kR, j < kC), 16
// rows x 16 f32 each, C[i][j] at base + 16 i rows + 64 j bytes.
template <class Tiles, int kR, int kC>
RPA_AMX_INLINE void ZeroC() {
  Tiles::template Zero<0>();
  if constexpr (kC > 1) Tiles::template Zero<1>();
  if constexpr (kR > 1) Tiles::template Zero<2>();
  if constexpr (kR > 1 && kC > 1) Tiles::template Zero<3>();
}
template <class Tiles, int kR, int kC>
RPA_AMX_INLINE void LoadC(const uint8_t* base, int64_t stride) {
  Tiles::template Load<0>(base, stride);
  if constexpr (kC > 1) Tiles::template Load<1>(base + 64, stride);
  if constexpr (kR > 1) Tiles::template Load<2>(base + 16 * stride, stride);
  if constexpr (kR > 1 && kC > 1) Tiles::template Load<3>(base + 16 * stride + 64, stride);
}
template <class Tiles, int kR, int kC>
RPA_AMX_INLINE void StoreC(uint8_t* base, int64_t stride) {
  Tiles::template Store<0>(base, stride);
  if constexpr (kC > 1) Tiles::template Store<1>(base + 64, stride);
  if constexpr (kR > 1) Tiles::template Store<2>(base + 16 * stride, stride);
  if constexpr (kR > 1 && kC > 1) Tiles::template Store<3>(base + 16 * stride + 64, stride);
}
// C[i][j] += A (tile 4 + i) B (tile 6 + j), back to back.
template <class Tiles, int kR, int kC>
RPA_AMX_INLINE void DpC() {
  Tiles::template Dp<0, 4, 6>();
  if constexpr (kC > 1) Tiles::template Dp<1, 4, 7>();
  if constexpr (kR > 1) Tiles::template Dp<2, 5, 6>();
  if constexpr (kR > 1 && kC > 1) Tiles::template Dp<3, 5, 7>();
}

// The operands of a product over `chunks` steps: A's rows (16 per tile, 64
// bytes = 32 bf16 of step c at a + 64 c), B's pair rows (16 per step, step c
// at b + 16 c b_stride: 2 x 16 columns side by side, 64 bytes each).
struct ChunkedOperands {
  const uint8_t* a;
  int64_t a_stride;  // Bytes between A rows.
  const uint8_t* b;
  int64_t b_stride;  // Bytes between B pair rows.
  int64_t chunks;
};

// C[i][j] += sum over the steps of A (tile 4 + i) B (tile 6 + j): both
// products' inner loop.
template <class Tiles, int kR, int kC>
RPA_AMX_GLUE RPA_AMX_INLINE void AccumulateChunks(const ChunkedOperands& o) {
  for (int64_t c = 0; c < o.chunks; ++c) {
    const uint8_t* b = o.b + 16 * c * o.b_stride;
    Tiles::template Load<4>(o.a + 64 * c, o.a_stride);
    Tiles::template Load<6>(b, o.b_stride);
    if constexpr (kC > 1) Tiles::template Load<7>(b + 64, o.b_stride);
    if constexpr (kR > 1) Tiles::template Load<5>(o.a + 16 * o.a_stride + 64 * c, o.a_stride);
    DpC<Tiles, kR, kC>();
  }
}

// ---- S = Q K^T. Tiles: C 0-3 (C[i][j] = tile 2 i + j), A 4-5 (q rows
// r0 + 16 i), B 6-7 (keys j0 + 16 j).
struct LogitsGeom {
  const uint8_t* q;       // [rows16][q_stride] bf16.
  int64_t q_stride;       // Bytes.
  const uint8_t* kp;      // [dim_pad / 2][n32][2] bf16.
  int64_t kp_stride;      // Bytes of a pair row: 4 * n32.
  int64_t chunks;         // dim_pad / 32.
  uint8_t* s;             // [rows16][s_stride] f32.
  int64_t s_stride;       // Bytes.
};

// A block of kR x 16 rows and kC x 16 keys, summed over every 32-dim chunk
// (added to s's values where kAccumulate).
template <class Tiles, bool kAccumulate, int kR, int kC>
RPA_AMX_GLUE RPA_AMX_INLINE void LogitsBlock(const LogitsGeom& g, int64_t r0, int64_t j0) {
  uint8_t* s = g.s + r0 * g.s_stride + 4 * j0;
  if constexpr (kAccumulate) {
    LoadC<Tiles, kR, kC>(s, g.s_stride);
  } else {
    ZeroC<Tiles, kR, kC>();
  }
  const uint8_t* q = g.q + r0 * g.q_stride;
  const uint8_t* kp = g.kp + 4 * j0;  // Key j0 of pair row 0.
  AccumulateChunks<Tiles, kR, kC>({q, g.q_stride, kp, g.kp_stride, g.chunks});  // Pairs: dims.
  StoreC<Tiles, kR, kC>(s, g.s_stride);
}

// Calls block.template operator()<kR, kC>(16 * row_tile, 16 * column_tile)
// over row_tiles x col_tiles 16 x 16 tiles in blocks of 2 x 2 (kR, kC = 1
// at an odd end), rows outside: what both products walk.
template <class Block>
RPA_AMX_GLUE RPA_AMX_INLINE void ForEachTileBlock(int64_t row_tiles, int64_t col_tiles,
                                                const Block& block) {
  for (int64_t rt = 0; rt < row_tiles; rt += 2) {
    const bool two_rows = rt + 1 < row_tiles;
    int64_t ct = 0;
    for (; ct + 1 < col_tiles; ct += 2) {
      if (two_rows) {
        block.template operator()<2, 2>(16 * rt, 16 * ct);
      } else {
        block.template operator()<1, 2>(16 * rt, 16 * ct);
      }
    }
    if (ct < col_tiles) {
      if (two_rows) {
        block.template operator()<2, 1>(16 * rt, 16 * ct);
      } else {
        block.template operator()<1, 1>(16 * rt, 16 * ct);
      }
    }
  }
}

// S = Q K^T on the tiles (AmxLogits), or S += Q K^T where kAccumulate
// (testing/amx_experimental.h). Row blocks of 32 (16 at an odd end) outside,
// key blocks of 32 (16) inside: a row block's q (8 KiB at head_dim 128)
// stays in L1 while K streams from L2.
template <class Tiles, bool kAccumulate = false>
RPA_AMX_GLUE void LogitsProgram(const AmxLogitsArgs& a) {
  if (a.rows <= 0 || a.n <= 0) return;
  Tiles::Configure(kConfigFull, kFullConfig);
  const LogitsGeom g{reinterpret_cast<const uint8_t*>(a.q),
                     2 * a.q_stride,
                     reinterpret_cast<const uint8_t*>(a.k_packed),
                     4 * AmxRoundUp(a.n, kAmxKeyAlign),
                     AmxRoundUp(a.head_dim, kAmxDimAlign) / 32,
                     reinterpret_cast<uint8_t*>(a.s),
                     4 * a.s_stride};
  ForEachTileBlock(AmxRoundUp(a.rows, 16) / 16, AmxRoundUp(a.n, 16) / 16,
                   [&]<int kR, int kC>(int64_t r0, int64_t c0) RPA_AMX_GLUE {
                     LogitsBlock<Tiles, kAccumulate, kR, kC>(g, r0, c0);
                   });
}

// ---- O += P V. Tiles: C 0-3 (acc rows r0 + 16 i, dims d0 + 16 j), A 4-5
// (weights of 32 keys), B 6-7 (16 key pairs x 16 dims).
struct PvGeom {
  const uint8_t* pb;  // [rows16][n32] bf16 weights.
  int64_t pb_stride;  // Bytes: 2 * (elements >= n32).
  const uint8_t* vp;  // [n32 / 2][d16][2] bf16.
  int64_t vp_stride;  // Bytes of a key-pair row: 4 * d16.
  int64_t chunks;     // n32 / 32.
  uint8_t* acc;       // [rows16][acc_stride] f32.
  int64_t acc_stride;  // Bytes.
};

template <class Tiles, int kR, int kC>
RPA_AMX_GLUE RPA_AMX_INLINE void PvBlock(const PvGeom& g, int64_t r0, int64_t d0) {
  uint8_t* acc = g.acc + r0 * g.acc_stride + 4 * d0;
  LoadC<Tiles, kR, kC>(acc, g.acc_stride);
  const uint8_t* pb = g.pb + r0 * g.pb_stride;
  const uint8_t* vp = g.vp + 4 * d0;
  AccumulateChunks<Tiles, kR, kC>({pb, g.pb_stride, vp, g.vp_stride, g.chunks});  // Pairs: keys.
  StoreC<Tiles, kR, kC>(acc, g.acc_stride);
}
// O += P V on the tiles (AmxPvBf16). Row blocks of 32 outside, dimension
// blocks of 32 inside (16 at odd ends); each block reads all of P's row
// block and V's column block.
template <class Tiles>
RPA_AMX_GLUE void PvProgram(const AmxPvBf16Args& a) {
  if (a.rows <= 0 || a.n <= 0) return;
  const int64_t n32 = AmxRoundUp(a.n, kAmxKeyAlign);
  Tiles::Configure(kConfigFull, kFullConfig);
  const PvGeom g{reinterpret_cast<const uint8_t*>(a.p_bf16),
                 2 * a.p_stride,
                 reinterpret_cast<const uint8_t*>(a.v_packed),
                 4 * AmxRoundUp(a.head_dim, kAmxVDimAlign),
                 n32 / 32,
                 reinterpret_cast<uint8_t*>(a.acc),
                 4 * a.acc_stride};
  ForEachTileBlock(AmxRoundUp(a.rows, 16) / 16, AmxRoundUp(a.head_dim, 16) / 16,
                   [&]<int kR, int kC>(int64_t r0, int64_t c0) RPA_AMX_GLUE {
                     PvBlock<Tiles, kR, kC>(g, r0, c0);
                   });
}

}  // namespace rpa::internal::amx

#endif  // __x86_64__
#endif  // RPA_SRC_KERNEL_AMX_TILE_PROGRAMS_H_
