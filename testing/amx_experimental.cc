#include "testing/amx_experimental.h"

#if defined(__x86_64__)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernel/amx_tile_programs.h"

namespace rpa::testing {
namespace {

using internal::AmxRoundUp;
using internal::kAmxDimAlign;
using internal::kAmxKeyAlign;
using internal::kAmxTileRows;
using internal::amx::DpC;
using internal::amx::HwTiles;
using internal::amx::kConfigFull;
using internal::amx::kFullConfig;
using internal::amx::StoreC;
using internal::amx::TileConfig;
using internal::amx::ZeroC;
using internal::avx512::RowReader;

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

void AmxLogitsAdd(const internal::AmxLogitsArgs& args, AmxBackend backend) {
  if (backend == AmxBackend::kHardware) {
    internal::amx::LogitsProgram<HwTiles, /*kAccumulate=*/true>(args);
  } else {
    internal::amx::LogitsProgram<EmuTiles, /*kAccumulate=*/true>(args);
  }
}

void AmxPv(const AmxPvArgs& args, AmxBackend backend) {
  internal::AmxWeightsToBf16(args.p, args.p_stride, args.rows, args.n, args.p_bf16);
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

double AmxBf16PeakGflops(double seconds) {
  if (!internal::AmxSupport().usable) return 0.0;
  return PeakImpl(seconds);
}

}  // namespace rpa::testing

#endif  // __x86_64__
