// The MLA kernel on AVX-512 BF16 (mla_avx512_bf16_pairs): both products by
// vdpbf16ps, pairs of bf16 multiplied and summed into f32 lanes.
//
// Arithmetic: keys are read in place from their pages (fp8 e4m3fn first
// converted to bf16 exactly through the table of avx512_common.h). Logits of
// more than 32 rows: q (bf16, exact) packed once per task into dimension
// pairs across rows, q_pairs [dim_qk / 2][R16][2]; per pair of dims, a key's
// two elements (one 32-bit broadcast) times 16 rows' q pairs, one vdpbf16ps.
// Up to 32 rows (decode of <= 32 heads): 32-dim chunks of 4 keys times
// chunks of 4 q rows, each accumulator summed across lanes at the end. PV: the tile's ckv
// rows are packed into key pairs [n / 2][dim_ckv][2] (odd n: a zero key) and
// the weights, rounded to bf16 (nearest even), into key pairs across rows
// [n / 2][R16][2]; per pair of keys, a row's two weights broadcast times 16
// dims' pairs. Products are exact, sums f32; the weights'
// bf16 rounding (2^-9 relative) is the only error beyond f32's, inside the
// bf16 tolerance; the softmax's sum l adds the unrounded weights.
//
// Shapes: blocks of kA broadcast pairs (keys for the logits, rows for PV) x
// kB vectors of 16 (rows, dims), kA * kB <= 24 accumulators, kA + kB loads
// per kA * kB vdpbf16ps.
//
// Dispatch: bf16 q with bf16 or fp8 e4m3fn latents where vdpbf16ps issues
// at the f32 FMA's rate (AMD Zen 4: twice its flops), mla_kernel.h.
#include "mla/mla_kernel.h"

#if defined(__x86_64__)
#include <algorithm>
#include <cstring>

#include "kernel/avx512_common.h"
#include "mla/mla_bf16_operands.h"

#define RPA_MLA_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace rpa::internal {
namespace {

// out[a][b] (+)= sum over segments and k of pair x_a[k] . pair y[k][b]
// (vdpbf16ps), b over vectors of 16 rows; a segment's x_a[k] is the pair at
// x_rows[a] (or x_base + a * x_a_step) + k * x_k_step, its y[k] at y + k *
// y_k_step (bf16 elements).
struct PairSegment {
  const void* const* x_rows;  // Null: x_base + a * x_a_step.
  const uint16_t* x_base;
  int64_t x_a_step, x_k_step;
  const uint16_t* y;
  int64_t y_k_step;
  int64_t k_count;
};

struct PairGemm {
  PairSegment seg[2];
  int num_segs;
  float* out;
  int64_t out_a_step;
  bool accumulate;
};

// vdpbf16ps's latency times its issue rate (Zen 4: 12 measured, the bf16
// peak's accumulators in testing/machine.cc) independent sums keep it busy:
// a block of fewer accumulators keeps two sets, even and odd k.
constexpr int kMinChains = 12;

template <int kA, int kB>
RPA_MLA_BF16_TARGET void PairBlock(const PairGemm& g, int64_t a0, int64_t b0) {
  constexpr int kSets = kA * kB < kMinChains ? 2 : 1;
  __m512 acc[kSets][kA][kB];
  for (int a = 0; a < kA; ++a) {
    for (int b = 0; b < kB; ++b) {
      acc[0][a][b] = g.accumulate
                         ? _mm512_loadu_ps(g.out + (a0 + a) * g.out_a_step + (b0 + b) * 16)
                         : _mm512_setzero_ps();
      if constexpr (kSets == 2) acc[1][a][b] = _mm512_setzero_ps();
    }
  }
  for (int si = 0; si < g.num_segs; ++si) {
    const PairSegment& seg = g.seg[si];
    const uint16_t* x[kA];
    for (int a = 0; a < kA; ++a) {
      x[a] = seg.x_rows != nullptr ? static_cast<const uint16_t*>(seg.x_rows[a0 + a])
                                   : seg.x_base + (a0 + a) * seg.x_a_step;
    }
    const uint16_t* y = seg.y + b0 * 32;
    // acc[set] += x_a[k] . y[k] for one k.
    auto step = [&](int set, int64_t k) __attribute__((always_inline)) RPA_MLA_BF16_TARGET {
      __m512i yv[kB];
      for (int b = 0; b < kB; ++b) yv[b] = _mm512_loadu_si512(y + k * seg.y_k_step + b * 32);
      for (int a = 0; a < kA; ++a) {
        int32_t pair;
        std::memcpy(&pair, x[a] + k * seg.x_k_step, sizeof(pair));
        const __m512bh xb = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
        for (int b = 0; b < kB; ++b) {
          acc[set][a][b] =
              _mm512_dpbf16_ps(acc[set][a][b], xb, reinterpret_cast<__m512bh>(yv[b]));
        }
      }
    };
    int64_t k = 0;
    for (; k + kSets <= seg.k_count; k += kSets) {
      step(0, k);
      if constexpr (kSets == 2) step(1, k + 1);
    }
    if (k < seg.k_count) step(0, k);
  }
  for (int a = 0; a < kA; ++a) {
    for (int b = 0; b < kB; ++b) {
      __m512 sum = acc[0][a][b];
      if constexpr (kSets == 2) sum = _mm512_add_ps(sum, acc[1][a][b]);
      _mm512_storeu_ps(g.out + (a0 + a) * g.out_a_step + (b0 + b) * 16, sum);
    }
  }
}

template <int kB>
RPA_MLA_BF16_TARGET void PairBlocksOf(const PairGemm& g, int64_t a_count, int64_t b0) {
  // Fewer than 24 accumulators for one or two vectors: the x pointers (one
  // general register each) must not spill either.
  constexpr int kA = kB <= 2 ? 8 : 6;
  ForEachMlaBlock<kA>(a_count, [&]<int kSize>(int64_t a0) RPA_MLA_BF16_TARGET {
    PairBlock<kSize, kB>(g, a0, b0);
  });
}

// a_count rows of out, width / 16 vectors each.
RPA_MLA_BF16_TARGET void PairProduct(const PairGemm& g, int64_t a_count, int64_t width) {
  const int64_t vectors = width / 16;
  int64_t b = 0;
  for (; b + 4 <= vectors; b += 4) PairBlocksOf<4>(g, a_count, b);
  switch (vectors - b) {
    case 3: PairBlocksOf<3>(g, a_count, b); break;
    case 2: PairBlocksOf<2>(g, a_count, b); break;
    case 1: PairBlocksOf<1>(g, a_count, b); break;
    default: break;
  }
}

// 16 f32 of a and 16 of b as bf16 pairs (a_i, b_i), nearest even.
RPA_MLA_BF16_TARGET inline __m512i InterleavePairs(__m512 a, __m512 b) {
  // cvtne2ps: b's 16 in the low half, a's... as bf16 lanes [a0..a15 | b0..b15]
  // for (b, a); then lane 2i = a_i, 2i + 1 = b_i.
  const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
  return _mm512_permutexvar_epi16(order, both);
}

// Up to this many rows (two vectors), the logits take q as whole rows
// (RowLogits): with keys across lanes broadcasting q pairs would cost a
// broadcast per one or two vdpbf16ps, more loads than the core issues.
constexpr int64_t kRowLogitsMaxRows = 32;

// q as bf16 (exact for bf16 q) in scratch->q_pairs: whole rows [R16][dim_qk]
// for RowLogits, else q_pairs[p][r] = (qt[2p][r], qt[2p + 1][r]).
RPA_MLA_BF16_TARGET void PairsPrepareQ(const MlaKernelArgs& args) {
  const MlaScratch& s = *args.scratch;
  const int64_t dim_qk = args.dim_ckv + args.dim_kpe;
  if (args.rows_pad <= kRowLogitsMaxRows) {
    for (int64_t r = 0; r < args.rows_pad; ++r) {
      for (int64_t d = 0; d < dim_qk; ++d) {
        s.q_pairs[r * dim_qk + d] = BF16FromF32(s.qt[d * args.rows_pad + r]).bits;
      }
    }
    return;
  }
  MlaQPairs(args, args.rows_pad);
}

// acc[4 k + r] += the vdpbf16ps of keys' and rows' `dims` dims (32 at a
// time, a masked last 16), lanes holding partial sums.
RPA_MLA_BF16_TARGET __attribute__((always_inline)) inline void RowDots(
    const uint16_t* const* keys, const uint16_t* const* rows, int64_t dims, __m512* acc) {
  for (int64_t d = 0; d < dims; d += 32) {
    const __mmask32 lanes = dims - d >= 32 ? ~__mmask32{0} : (__mmask32{1} << (dims - d)) - 1;
    __m512i kv[4], qv[4];
    for (int k = 0; k < 4; ++k) kv[k] = _mm512_maskz_loadu_epi16(lanes, keys[k] + d);
    for (int r = 0; r < 4; ++r) qv[r] = _mm512_maskz_loadu_epi16(lanes, rows[r] + d);
    for (int k = 0; k < 4; ++k) {
      for (int r = 0; r < 4; ++r) {
        acc[4 * k + r] = _mm512_dpbf16_ps(acc[4 * k + r], reinterpret_cast<__m512bh>(kv[k]),
                                          reinterpret_cast<__m512bh>(qv[r]));
      }
    }
  }
}

// st[i][r] for 4 keys x 4 rows from 16 accumulators of whole 32-dim chunks
// (keys and q rows as they lie), each summed across its lanes at the end
// (SumEach16): 8 loads per 16 vdpbf16ps. A key block past n repeats key
// n - 1 and stores only the keys below n.
RPA_MLA_BF16_TARGET void RowLogits(const MlaKernelArgs& args, const MlaTile& tile) {
  const MlaScratch& s = *args.scratch;
  const int64_t dim_qk = args.dim_ckv + args.dim_kpe;
  for (int64_t i0 = 0; i0 < tile.n; i0 += 4) {
    const uint16_t* ckv[4];
    const uint16_t* kpe[4];
    for (int k = 0; k < 4; ++k) {
      const int64_t i = std::min<int64_t>(i0 + k, tile.n - 1);
      ckv[k] = static_cast<const uint16_t*>(tile.ckv[i]);
      kpe[k] = static_cast<const uint16_t*>(tile.kpe[i]);
    }
    const int64_t keys = std::min<int64_t>(4, tile.n - i0);
    for (int64_t r0 = 0; r0 < args.rows_pad; r0 += 4) {
      const uint16_t* q_nope[4];
      const uint16_t* q_pe[4];
      for (int r = 0; r < 4; ++r) {
        q_nope[r] = s.q_pairs + (r0 + r) * dim_qk;
        q_pe[r] = q_nope[r] + args.dim_ckv;
      }
      __m512 acc[16];
      for (__m512& a : acc) a = _mm512_setzero_ps();
      RowDots(ckv, q_nope, args.dim_ckv, acc);
      RowDots(kpe, q_pe, args.dim_kpe, acc);
      alignas(64) float sums[16];
      _mm512_store_ps(sums, avx512::SumEach16(acc));
      for (int64_t k = 0; k < keys; ++k) {
        std::memcpy(s.st + (i0 + k) * args.rows_pad + r0, sums + 4 * k, 4 * sizeof(float));
      }
    }
  }
}

// count (a multiple of 16) fp8 e4m3fn codes at src as bf16 at dst.
RPA_MLA_BF16_TARGET void E4m3RowToBf16(const uint8_t* src, int64_t count, const avx512::Fp8Lut& lut,
                                       uint16_t* dst) {
  for (int64_t d = 0; d < count; d += 32) {
    const __mmask32 lanes = count - d >= 32 ? ~__mmask32{0} : (__mmask32{1} << (count - d)) - 1;
    const __m512i codes = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(lanes, src + d));
    _mm512_mask_storeu_epi16(dst + d, lanes, avx512::Fp8ToBf16(codes, lut));
  }
}

// bf16 rows are read in place; fp8 e4m3fn rows become bf16 rows [n][dim_qk]
// in the tile scratch.
RPA_MLA_BF16_TARGET MlaTile PairsPrepareTile(const MlaKernelArgs& args, const MlaTile& rows) {
  if (rows.dtype == DType::kBF16) return rows;
  return MlaTileAsBf16Rows(args, rows, args.dim_ckv + args.dim_kpe, rows.n);
}

RPA_MLA_BF16_TARGET void PairsLogits(const MlaKernelArgs& args, const MlaTile& tile) {
  if (args.rows_pad <= kRowLogitsMaxRows) return RowLogits(args, tile);
  const MlaScratch& s = *args.scratch;
  const int64_t y_step = 2 * args.rows_pad;
  PairGemm g{};
  g.seg[0] = PairSegment{tile.ckv, nullptr, 0, 2, s.q_pairs, y_step, args.dim_ckv / 2};
  g.seg[1] = PairSegment{tile.kpe, nullptr, 0, 2, s.q_pairs + args.dim_ckv / 2 * y_step, y_step,
                         args.dim_kpe / 2};
  g.num_segs = 2;
  g.out = s.st;
  g.out_a_step = args.rows_pad;
  g.accumulate = false;
  PairProduct(g, tile.n, args.rows_pad);
}

// The tile's V (its ckv rows) in key pairs, [ceil(n / 2)][dim_ckv][2], after
// the converted rows in the tile scratch; a zero key pads an odd n.
RPA_MLA_BF16_TARGET uint16_t* PackValues(const MlaKernelArgs& args, const MlaTile& tile) {
  const int64_t dim_qk = args.dim_ckv + args.dim_kpe;
  uint16_t* packed = reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(args.scratch->tile) +
                                                 kMlaTileKeys * dim_qk * 4);
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40,
                                      8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int64_t j = 0; 2 * j < tile.n; ++j) {
    const auto* a = static_cast<const uint16_t*>(tile.ckv[2 * j]);
    const auto* b = 2 * j + 1 < tile.n ? static_cast<const uint16_t*>(tile.ckv[2 * j + 1]) : nullptr;
    uint16_t* out = packed + j * 2 * args.dim_ckv;
    for (int64_t d = 0; d < args.dim_ckv; d += 32) {
      const __mmask32 lanes =
          args.dim_ckv - d >= 32 ? ~__mmask32{0} : (__mmask32{1} << (args.dim_ckv - d)) - 1;
      const __m512i va = _mm512_maskz_loadu_epi16(lanes, a + d);
      const __m512i vb = b != nullptr ? _mm512_maskz_loadu_epi16(lanes, b + d) : _mm512_setzero_si512();
      _mm512_storeu_si512(out + 2 * d, _mm512_permutex2var_epi16(va, lo, vb));
      if (args.dim_ckv - d > 16) {
        _mm512_storeu_si512(out + 2 * d + 32, _mm512_permutex2var_epi16(va, hi, vb));
      }
    }
  }
  return packed;
}

// The weights st [n][R16] in key pairs across rows, [ceil(n / 2)][R16][2] bf16.
RPA_MLA_BF16_TARGET uint16_t* PackWeights(const MlaKernelArgs& args, const MlaTile& tile) {
  const MlaScratch& s = *args.scratch;
  uint16_t* packed = reinterpret_cast<uint16_t*>(
      static_cast<uint8_t*>(s.tile) +
      kMlaTileKeys * ((args.dim_ckv + args.dim_kpe) * 4 + args.dim_ckv * 2));
  for (int64_t j = 0; 2 * j < tile.n; ++j) {
    const bool second = 2 * j + 1 < tile.n;
    for (int64_t r = 0; r < args.rows_pad; r += 16) {
      const __m512 a = _mm512_loadu_ps(s.st + 2 * j * args.rows_pad + r);
      const __m512 b = second ? _mm512_loadu_ps(s.st + (2 * j + 1) * args.rows_pad + r)
                              : _mm512_setzero_ps();
      _mm512_storeu_si512(packed + (j * args.rows_pad + r) * 2, InterleavePairs(a, b));
    }
  }
  return packed;
}

RPA_MLA_BF16_TARGET void PairsPv(const MlaKernelArgs& args, const MlaTile& tile) {
  const MlaScratch& s = *args.scratch;
  const uint16_t* values = PackValues(args, tile);
  const uint16_t* weights = PackWeights(args, tile);
  PairGemm g{};
  g.seg[0] = PairSegment{nullptr, weights, 2, 2 * args.rows_pad, values, 2 * args.dim_ckv,
                         (tile.n + 1) / 2};
  g.num_segs = 1;
  g.out = s.acc;
  g.out_a_step = args.dim_ckv;
  g.accumulate = true;
  PairProduct(g, args.rows, args.dim_ckv);
}

}  // namespace

RPA_MLA_BF16_TARGET void MlaQPairs(const MlaKernelArgs& args, int64_t row_stride) {
  const MlaScratch& s = *args.scratch;
  const int64_t dim_qk = args.dim_ckv + args.dim_kpe;  // Even: multiples of 16.
  for (int64_t p = 0; p < dim_qk / 2; ++p) {
    uint16_t* out = s.q_pairs + p * row_stride * 2;
    for (int64_t r = 0; r < args.rows_pad; r += 16) {
      const __m512i v = InterleavePairs(_mm512_loadu_ps(s.qt + 2 * p * args.rows_pad + r),
                                        _mm512_loadu_ps(s.qt + (2 * p + 1) * args.rows_pad + r));
      _mm512_storeu_si512(out + r * 2, v);
    }
    std::memset(out + args.rows_pad * 2, 0, sizeof(uint16_t) * 2 * (row_stride - args.rows_pad));
  }
}

RPA_MLA_BF16_TARGET MlaTile MlaTileAsBf16Rows(const MlaKernelArgs& args, const MlaTile& rows,
                                              int64_t row_stride, int64_t padded_n) {
  const MlaScratch& s = *args.scratch;
  const int64_t dim_qk = args.dim_ckv + args.dim_kpe;
  const avx512::Fp8Lut lut = avx512::LoadLut(avx512::Fp8TableOf(DType::kF8E4M3FN, false));
  uint16_t* tile = static_cast<uint16_t*>(s.tile);
  // One latent slice (ckv or kpe) of a row, as bf16 at dst.
  auto slice = [&](const void* src, int64_t count, uint16_t* dst) RPA_MLA_BF16_TARGET {
    if (rows.dtype == DType::kBF16) {
      std::memcpy(dst, src, sizeof(uint16_t) * static_cast<size_t>(count));
    } else {
      E4m3RowToBf16(static_cast<const uint8_t*>(src), count, lut, dst);
    }
  };
  for (int64_t i = 0; i < rows.n; ++i) {
    uint16_t* row = tile + i * row_stride;
    slice(rows.ckv[i], args.dim_ckv, row);
    slice(rows.kpe[i], args.dim_kpe, row + args.dim_ckv);
    std::memset(row + dim_qk, 0, sizeof(uint16_t) * static_cast<size_t>(row_stride - dim_qk));
    s.ckv_rows[i] = row;
    s.kpe_rows[i] = row + args.dim_ckv;
  }
  std::memset(tile + rows.n * row_stride, 0,
              sizeof(uint16_t) * static_cast<size_t>((padded_n - rows.n) * row_stride));
  return MlaTile{DType::kBF16, rows.n, s.ckv_rows, s.kpe_rows};
}

const MlaKernel kMlaAvx512Bf16Pairs = {"mla_avx512_bf16_pairs", /*e4m3_scaled=*/false,
                                       NextTilePrefetch::kUpFront, PairsPrepareQ,
                                       PairsPrepareTile, PairsLogits, PairsPv};

}  // namespace rpa::internal

#endif  // __x86_64__
