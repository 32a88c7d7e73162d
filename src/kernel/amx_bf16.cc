// AMX-BF16 tile products for one kv head's rows over one KV tile (amx.h).
//
// No file-wide -m flag: every function that runs an AVX-512 instruction has
// a target attribute, and the tile instructions are inline assembly (GCC
// 12's AMX intrinsics are macros that want literal tile numbers and have no
// memory clobber; Clang 14's builtins differ): here each tile instruction
// takes its tile numbers as template constants ("i" operands printed with
// %c) and its memory effects as a "memory" clobber, so a buffer filled just
// before is stored before the tile load reads it, in either compiler. Both
// assemblers take the mnemonics whatever the function's target.
//
// The same tile programs also run on EmuTiles, a scalar model of the eight
// tiles and tdpbf16ps (same configuration checks), so the blocking and
// layouts are tested on CPUs without AMX.
#include "kernel/amx.h"

#include "kernel/avx512_common.h"
#include "kernel/cpu_features.h"

#if defined(__x86_64__)
// GCC 12's _mm512_undefined_* are written `__m512 __Y = __Y;`, which
// -Wuninitialized flags wherever they inline (GCC bug 105593).
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#endif

namespace rpa::internal {

// Detection lives with every other CPU feature (cpu_features.cc).
const AmxStatus& AmxSupport() {
  static const AmxStatus status{DetectedCpuFeatures().amx_bf16, AmxDetection()};
  return status;
}

#if defined(__x86_64__)

namespace {

#define RPA_AMX_GLUE __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define RPA_AMX_INLINE __attribute__((always_inline)) inline

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

// ---- A scalar model of the same tiles, per thread. tdpbf16ps as the SDM
// writes it: for each C element, two exact bf16 products added in turn per
// pair, denormal inputs as zero, denormal results flushed; a configuration
// that does not fit the operands aborts (the hardware raises #UD).
struct EmuTiles {
  struct State {
    TileConfig config;
    bool configured = false;
    alignas(64) uint8_t tile[8][1024];
  };
  static inline thread_local int config_id = 0;
  static State& S() {
    static thread_local State state;
    return state;
  }
  [[noreturn]] static void Fail(const char* what) {
    std::fprintf(stderr, "EmuTiles: %s\n", what);
    std::abort();
  }
  static void Configure(int id, const TileConfig& config) {
    if (config_id == id) return;
    S().config = config;
    S().configured = true;
    std::memset(S().tile, 0, sizeof(S().tile));
    config_id = id;
  }
  template <int kT>
  static void Load(const void* base, int64_t stride_bytes) {
    State& s = S();
    if (!s.configured || s.config.rows[kT] == 0) Fail("tileloadd on an unconfigured tile");
    std::memset(s.tile[kT], 0, 1024);
    for (int r = 0; r < s.config.rows[kT]; ++r) {
      std::memcpy(s.tile[kT] + 64 * r, static_cast<const uint8_t*>(base) + r * stride_bytes,
                  s.config.colsb[kT]);
    }
  }
  template <int kT>
  static void Store(void* base, int64_t stride_bytes) {
    State& s = S();
    if (!s.configured || s.config.rows[kT] == 0) Fail("tilestored of an unconfigured tile");
    for (int r = 0; r < s.config.rows[kT]; ++r) {
      std::memcpy(static_cast<uint8_t*>(base) + r * stride_bytes, s.tile[kT] + 64 * r,
                  s.config.colsb[kT]);
    }
  }
  template <int kT>
  static void Zero() {
    std::memset(S().tile[kT], 0, 1024);
  }
  static float Bf16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    if ((h & 0x7F80) == 0) h &= 0x8000;  // DAZ.
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  template <int kC, int kA, int kB>
  static void Dp() {
    State& s = S();
    const TileConfig& c = s.config;
    const int m_rows = c.rows[kC], pairs = c.colsb[kA] / 4, cols = c.colsb[kC] / 4;
    const bool fits = s.configured && m_rows > 0 && pairs > 0 && cols > 0 &&
                      c.rows[kA] == m_rows && c.rows[kB] == pairs && c.colsb[kB] == c.colsb[kC];
    if (!fits) {
      Fail("tdpbf16ps operands do not fit the configuration");
    }
    for (int m = 0; m < m_rows; ++m) {
      for (int n = 0; n < cols; ++n) {
        float acc;
        std::memcpy(&acc, s.tile[kC] + 64 * m + 4 * n, 4);
        for (int k = 0; k < pairs; ++k) {
          const uint8_t* a = s.tile[kA] + 64 * m + 4 * k;
          const uint8_t* b = s.tile[kB] + 64 * k + 4 * n;
          acc += Bf16(a) * Bf16(b);
          acc += Bf16(a + 2) * Bf16(b + 2);
        }
        if (std::fpclassify(acc) == FP_SUBNORMAL) acc = std::copysign(0.0f, acc);  // FTZ.
        std::memcpy(s.tile[kC] + 64 * m + 4 * n, &acc, 4);
      }
    }
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
  bool accumulate;
};

// A block of kR x 16 rows and kC x 16 keys, summed over every 32-dim chunk
// (added to s's values where accumulate).
template <class Tiles, int kR, int kC>
RPA_AMX_GLUE RPA_AMX_INLINE void LogitsBlock(const LogitsGeom& g, int64_t r0, int64_t j0) {
  uint8_t* s = g.s + r0 * g.s_stride + 4 * j0;
  if (g.accumulate) {
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

// Row blocks of 32 (16 at an odd end) outside, key blocks of 32 (16) inside:
// a row block's q (8 KiB at head_dim 128) stays in L1 while K streams from L2.
template <class Tiles>
RPA_AMX_GLUE void LogitsImpl(const AmxLogitsArgs& a) {
  if (a.rows <= 0 || a.n <= 0) return;
  Tiles::Configure(kConfigFull, kFullConfig);
  const LogitsGeom g{reinterpret_cast<const uint8_t*>(a.q),
                     2 * a.q_stride,
                     reinterpret_cast<const uint8_t*>(a.k_packed),
                     4 * AmxRoundUp(a.n, kAmxKeyAlign),
                     AmxRoundUp(a.head_dim, kAmxDimAlign) / 32,
                     reinterpret_cast<uint8_t*>(a.s),
                     4 * a.s_stride,
                     a.accumulate};
  ForEachTileBlock(AmxRoundUp(a.rows, 16) / 16, AmxRoundUp(a.n, 16) / 16,
                   [&]<int kR, int kC>(int64_t r0, int64_t c0) RPA_AMX_GLUE {
                     LogitsBlock<Tiles, kR, kC>(g, r0, c0);
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

RPA_AMX_GLUE RPA_AMX_INLINE __mmask16 Mask16(int64_t count) {
  return count >= 16 ? __mmask16{0xFFFF}
         : count <= 0 ? __mmask16{0}
                      : static_cast<__mmask16>((1u << count) - 1);
}
RPA_AMX_GLUE RPA_AMX_INLINE __mmask32 Mask32(int64_t count) {
  return count >= 32 ? ~__mmask32{0}
         : count <= 0 ? __mmask32{0}
                      : static_cast<__mmask32>((1u << count) - 1);
}

// pb [rows16][n32] = bf16(p) (nearest even), zero for keys >= n and rows
// >= rows; p's columns >= n are not read.
RPA_AMX_GLUE void WeightsToBf16(const float* p, int64_t p_stride, int64_t rows, int64_t n,
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
      const __m512 lo = _mm512_maskz_loadu_ps(Mask16(n - i), row + i);
      const __m512 hi = _mm512_maskz_loadu_ps(Mask16(n - i - 16), row + i + 16);
      _mm512_storeu_si512(out + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
    }
  }
}

// Row blocks of 32 outside, dimension blocks of 32 inside (16 at odd ends);
// each block reads all of P's row block and V's column block.
template <class Tiles>
RPA_AMX_GLUE void PvImpl(const AmxPvBf16Args& a) {
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

// ---- Packs: K/V row chunks converted to bf16 in registers.

// Reads one K/V row's elements [d0, d0 + 32) as 32 bf16 (zero past
// head_dim; masked loads read nothing past it).
template <DType kDtype>
struct RowReader {
  avx512::Fp8Lut lut;  // fp8: the exact table (e4m3fn at its true value) in registers.
  int64_t head_dim;

  RPA_AMX_GLUE explicit RowReader(int64_t dim)
      : lut(avx512::LoadLut(avx512::Fp8TableOf(kDtype, /*e4m3_scaled=*/false))),
        head_dim(dim) {}

  RPA_AMX_GLUE RPA_AMX_INLINE __m512i operator()(const void* row, int64_t d0) const {
    const __mmask32 mask = Mask32(head_dim - d0);
    if constexpr (kDtype == DType::kBF16) {
      return _mm512_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(row) + d0);
    } else if constexpr (kDtype == DType::kI8) {
      const __m256i x = _mm256_maskz_loadu_epi8(mask, static_cast<const int8_t*>(row) + d0);
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(x)));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(x, 1)));
      return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));  // Exact: |x| <= 128.
    } else {
      const uint8_t* src = static_cast<const uint8_t*>(row) + d0;
      return avx512::Fp8ToBf16(_mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(mask, src)), lut);
    }
  }
};

// v[j] lane c becomes v[c] lane j (16 x 16 dwords): 32-bit and 64-bit
// unpacks within 128-bit blocks, then two rounds of block shuffles.
RPA_AMX_GLUE RPA_AMX_INLINE void Transpose16x16(__m512i* v) {
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

// Blocks of 16 keys x 32 dims: 16 row chunks (16 dim pairs each) transposed
// into 16 pair rows of 16 keys, each stored as one 64-byte vector.
template <DType kDtype>
RPA_AMX_GLUE void PackKeysImpl(const AmxPackArgs& a) {
  const RowReader<kDtype> read(a.head_dim);
  const int64_t n32 = AmxRoundUp(a.n, kAmxKeyAlign);
  const int64_t dim_pad = AmxRoundUp(a.head_dim, kAmxDimAlign);
  for (int64_t i0 = 0; i0 < n32; i0 += 16) {
    for (int64_t d0 = 0; d0 < dim_pad; d0 += 32) {
      __m512i v[16];
      for (int64_t j = 0; j < 16; ++j) {
        v[j] = i0 + j < a.n ? read(a.rows[i0 + j], d0) : _mm512_setzero_si512();
      }
      Transpose16x16(v);
      uint16_t* out = a.out + (d0 / 2) * 2 * n32 + 2 * i0;
      for (int64_t t = 0; t < 16; ++t) _mm512_storeu_si512(out + t * 2 * n32, v[t]);
    }
  }
}

// Key pairs: rows 2 i and 2 i + 1 interleaved element by element (vpermt2w)
// into one pair row of d16 dims.
template <DType kDtype>
RPA_AMX_GLUE void PackValuesImpl(const AmxPackArgs& a) {
  const RowReader<kDtype> read(a.head_dim);
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

// ---- Decode: S^T = K Q^T. Tiles: C 0-3 (C[i][j] = tile 2 i + j: keys
// i0 + 16 i, q heads 16 j ..), A 4-5 (key blocks), B 6-7 (q head halves).
constexpr int kConfigDecodeBase = 100;  // + g.

TileConfig DecodeConfig(int64_t g) {
  TileConfig c;
  const int g0 = static_cast<int>(std::min<int64_t>(g, 16)), g1 = static_cast<int>(g) - g0;
  for (int t : {4, 5}) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  for (int t : {0, 2, 6}) {
    c.rows[t] = 16;
    c.colsb[t] = static_cast<uint16_t>(4 * g0);
  }
  if (g1 > 0) {
    for (int t : {1, 3, 7}) {
      c.rows[t] = 16;
      c.colsb[t] = static_cast<uint16_t>(4 * g1);
    }
  }
  return c;
}

struct DecodeGeom {
  const uint8_t* qt;  // [dim32 / 2][g][2] bf16.
  int64_t qt_stride;  // Bytes: 4 g.
  int64_t chunks;     // dim32 / 32.
  uint8_t* st;        // [n16][st_stride] f32.
  int64_t st_stride;  // Bytes.
};

// Keys [i0, i0 + 16 kR) x q heads, A tiles at a[i] (a_stride[i] bytes per key).
template <class Tiles, int kR, int kC>
RPA_AMX_GLUE RPA_AMX_INLINE void DecodeBlock(const DecodeGeom& g, const uint8_t* const* a,
                                             const int64_t* a_stride, int64_t i0) {
  ZeroC<Tiles, kR, kC>();
  for (int64_t c = 0; c < g.chunks; ++c) {
    const uint8_t* b = g.qt + 16 * c * g.qt_stride;
    Tiles::template Load<4>(a[0] + 64 * c, a_stride[0]);
    Tiles::template Load<6>(b, g.qt_stride);
    if constexpr (kC > 1) Tiles::template Load<7>(b + 64, g.qt_stride);
    if constexpr (kR > 1) Tiles::template Load<5>(a[1] + 64 * c, a_stride[1]);
    DpC<Tiles, kR, kC>();
  }
  StoreC<Tiles, kR, kC>(g.st + i0 * g.st_stride, g.st_stride);
}

// Where the A tile of keys [i0, i0 + 16) comes from: the cache rows
// themselves (bf16, whole 32-dim chunks, 16 keys equally far apart), else
// `block` ([16][dim32] bf16) filled with the converted rows, zero padded.
template <DType kDtype>
RPA_AMX_GLUE RPA_AMX_INLINE const uint8_t* KeyBlock(const AmxDecodeLogitsArgs& a,
                                                    const RowReader<kDtype>& read, int64_t i0,
                                                    uint16_t* block, int64_t* stride) {
  const int64_t dim32 = AmxRoundUp(a.head_dim, kAmxDimAlign);
  if (kDtype == DType::kBF16 && a.head_dim == dim32 && i0 + 16 <= a.n) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(a.k_rows[i0]);
    const uintptr_t step = reinterpret_cast<uintptr_t>(a.k_rows[i0 + 1]) - first;
    bool regular = true;
    for (int64_t j = 2; j < 16; ++j) {
      regular &= reinterpret_cast<uintptr_t>(a.k_rows[i0 + j]) - first ==
                 static_cast<uintptr_t>(j) * step;
    }
    if (regular) {
      *stride = static_cast<int64_t>(step);  // Wraps to a negative stride where rows go down.
      return static_cast<const uint8_t*>(a.k_rows[i0]);
    }
  }
  for (int64_t j = 0; j < 16; ++j) {
    for (int64_t d0 = 0; d0 < dim32; d0 += 32) {
      _mm512_storeu_si512(block + j * dim32 + d0,
                          i0 + j < a.n ? read(a.k_rows[i0 + j], d0) : _mm512_setzero_si512());
    }
  }
  *stride = 2 * dim32;
  return reinterpret_cast<const uint8_t*>(block);
}

template <class Tiles, DType kDtype>
RPA_AMX_GLUE void DecodeLogitsImpl(const AmxDecodeLogitsArgs& a) {
  if (a.n <= 0 || a.g <= 0) return;
  const RowReader<kDtype> read(a.head_dim);
  const int64_t dim32 = AmxRoundUp(a.head_dim, kAmxDimAlign);
  const DecodeGeom geom{reinterpret_cast<const uint8_t*>(a.qt), 4 * a.g, dim32 / 32,
                        reinterpret_cast<uint8_t*>(a.st), 4 * a.st_stride};
  Tiles::Configure(kConfigDecodeBase + static_cast<int>(a.g), DecodeConfig(a.g));
  const int64_t key_tiles = AmxRoundUp(a.n, 16) / 16;
  for (int64_t kt = 0; kt < key_tiles; kt += 2) {
    const uint8_t* src[2];
    int64_t stride[2] = {0, 0};
    src[0] = KeyBlock<kDtype>(a, read, 16 * kt, a.scratch, &stride[0]);
    if (kt + 1 < key_tiles) {
      src[1] = KeyBlock<kDtype>(a, read, 16 * kt + 16, a.scratch + 16 * dim32, &stride[1]);
      if (a.g > 16) {
        DecodeBlock<Tiles, 2, 2>(geom, src, stride, 16 * kt);
      } else {
        DecodeBlock<Tiles, 2, 1>(geom, src, stride, 16 * kt);
      }
    } else if (a.g > 16) {
      DecodeBlock<Tiles, 1, 2>(geom, src, stride, 16 * kt);
    } else {
      DecodeBlock<Tiles, 1, 1>(geom, src, stride, 16 * kt);
    }
  }
}

template <class Tiles>
void DecodeLogitsDispatch(const AmxDecodeLogitsArgs& a) {
  switch (a.dtype) {
    case DType::kBF16: DecodeLogitsImpl<Tiles, DType::kBF16>(a); return;
    case DType::kF8E4M3FN: DecodeLogitsImpl<Tiles, DType::kF8E4M3FN>(a); return;
    case DType::kF8E5M2: DecodeLogitsImpl<Tiles, DType::kF8E5M2>(a); return;
    case DType::kI8: DecodeLogitsImpl<Tiles, DType::kI8>(a); return;
    default:
      std::fprintf(stderr, "AmxDecodeLogitsT: K dtype %s is not exact in bf16\n",
                   std::string(ToString(a.dtype)).c_str());
      std::abort();
  }
}

// ---- The peak probe: C tiles 0-5 += A (tile 6) B (tile 7), in batches.
RPA_AMX_GLUE double PeakImpl(double seconds) {
  alignas(64) uint16_t ones[512];  // bf16 1.0: finite, never subnormal.
  std::fill(ones, ones + 512, uint16_t{0x3F80});
  HwTiles::Configure(kConfigFull, kFullConfig);
  HwTiles::Load<6>(ones, 64);
  HwTiles::Load<7>(ones, 64);
  auto batch = [](int64_t iterations) {
    for (int64_t i = 0; i < iterations; ++i) {
      HwTiles::Dp<0, 6, 7>();
      HwTiles::Dp<1, 6, 7>();
      HwTiles::Dp<2, 6, 7>();
      HwTiles::Dp<3, 6, 7>();
      HwTiles::Dp<4, 6, 7>();
      HwTiles::Dp<5, 6, 7>();
    }
  };
  HwTiles::Zero<0>(); HwTiles::Zero<1>(); HwTiles::Zero<2>();
  HwTiles::Zero<3>(); HwTiles::Zero<4>(); HwTiles::Zero<5>();
  batch(20000);  // Warm-up: the core's AMX power license.
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  int64_t done = 0;
  double elapsed = 0;
  constexpr int64_t kBatch = 4096;
  do {
    batch(kBatch);
    done += kBatch;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < seconds);
  return 6.0 * static_cast<double>(done) * (2.0 * 16 * 16 * 32) / elapsed * 1e-9;
}

}  // namespace

void AmxPackKeys(const AmxPackArgs& args) {
  if (args.n > 0 && args.head_dim > 0) DispatchDtype<PackKeysFn>(args);
}

void AmxPackValues(const AmxPackArgs& args) {
  if (args.n > 0 && args.head_dim > 0) DispatchDtype<PackValuesFn>(args);
}

void AmxLogits(const AmxLogitsArgs& args, AmxBackend backend) {
  if (backend == AmxBackend::kHardware) {
    LogitsImpl<HwTiles>(args);
  } else {
    LogitsImpl<EmuTiles>(args);
  }
}

void AmxWeightsToBf16(const float* p, int64_t p_stride, int64_t rows, int64_t n,
                      uint16_t* p_bf16) {
  if (rows > 0 && n > 0) WeightsToBf16(p, p_stride, rows, n, p_bf16);
}

void AmxPvBf16(const AmxPvBf16Args& args, AmxBackend backend) {
  if (backend == AmxBackend::kHardware) {
    PvImpl<HwTiles>(args);
  } else {
    PvImpl<EmuTiles>(args);
  }
}

void AmxPv(const AmxPvArgs& args, AmxBackend backend) {
  AmxWeightsToBf16(args.p, args.p_stride, args.rows, args.n, args.p_bf16);
  AmxPvBf16({args.p_bf16, AmxRoundUp(args.n, kAmxKeyAlign), args.rows, args.v_packed, args.n,
             args.head_dim, args.acc, args.acc_stride},
            backend);
}

void AmxPackQt(const uint16_t* q, int64_t q_stride, int64_t g, int64_t head_dim,
               uint16_t* out) {
  const int64_t dim32 = AmxRoundUp(head_dim, kAmxDimAlign);
  for (int64_t d = 0; d < dim32; ++d) {
    for (int64_t j = 0; j < g; ++j) {
      out[(d / 2) * 2 * g + 2 * j + d % 2] = d < head_dim ? q[j * q_stride + d] : uint16_t{0};
    }
  }
}

void AmxDecodeLogitsT(const AmxDecodeLogitsArgs& args, AmxBackend backend) {
  if (backend == AmxBackend::kHardware) {
    DecodeLogitsDispatch<HwTiles>(args);
  } else {
    DecodeLogitsDispatch<EmuTiles>(args);
  }
}

namespace {

// The tile's rows as the packs take them.
const void* const* RowPointers(const KvRows& rows, const TileScratch& scratch) {
  for (int64_t i = 0; i < rows.count; ++i) scratch.row_pointers[i] = rows[i];
  return scratch.row_pointers;
}

}  // namespace

template <DType kDtype>
const uint16_t* TilePacks<kDtype>::Keys(const KvTile& tile, const TileScratch& scratch) {
  PrefetchRows(tile.k_next, 0, tile.k_next.count, tile.row_bytes);
  uint16_t* packed = reinterpret_cast<uint16_t*>(scratch.packed);
  if (tile.n > 0 && tile.head_dim > 0) {
    PackKeysImpl<kDtype>({kDtype, RowPointers(tile.k, scratch), tile.n, tile.head_dim, packed});
  }
  return packed;
}

template <DType kDtype>
const uint16_t* TilePacks<kDtype>::Values(const KvTile& tile, const TileScratch& scratch) {
  PrefetchRows(tile.v_next, 0, tile.v_next.count, tile.row_bytes);
  uint16_t* packed = reinterpret_cast<uint16_t*>(scratch.packed);
  if (tile.n > 0 && tile.head_dim > 0) {
    PackValuesImpl<kDtype>({kDtype, RowPointers(tile.v, scratch), tile.n, tile.head_dim, packed});
  }
  return packed;
}

template struct TilePacks<DType::kBF16>;
template struct TilePacks<DType::kF8E4M3FN>;
template struct TilePacks<DType::kF8E5M2>;
template struct TilePacks<DType::kI8>;

const uint16_t* WeightsToBf16InPlace(const TileLogits& p, int64_t n) {
  uint16_t* weights = reinterpret_cast<uint16_t*>(p.s);
  AmxWeightsToBf16(p.s, p.stride, p.rows, n, weights);
  return weights;
}

void AmxReleaseTiles() {
  if (HwTiles::config_id != 0) HwTiles::Release();  // Only a thread that loaded tiles.
}

double AmxBf16PeakGflops(double seconds) {
  if (!AmxSupport().usable) return 0.0;
  return PeakImpl(seconds);
}

#endif  // defined(__x86_64__)

}  // namespace rpa::internal
