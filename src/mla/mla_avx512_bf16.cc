// The MLA kernel on AVX-512 BF16 (mla_avx512_bf16_pairs): both products by
// vdpbf16ps, pairs of bf16 multiplied and summed into f32 lanes.
//
// Arithmetic: q (bf16, exact) is packed once per task into dimension pairs
// across rows, q_pairs [dim_qk / 2][R16][2]. Logits: per pair of dims, a
// key's two cache elements (one 32-bit broadcast, read in place from its
// page; fp8 e4m3fn first converted to bf16 exactly through the table of
// avx512_common.h) times 16 rows' q pairs, one vdpbf16ps. PV: the tile's ckv
// rows are packed into key pairs [n / 2][dim_ckv][2] (odd n: a zero key) and
// the weights, rounded to bf16 (nearest even), into key pairs across rows
// [n / 2][R16][2]; per pair of keys, a dimension's two elements broadcast
// times 16 rows' weight pairs. Products are exact, sums f32; the weights'
// bf16 rounding (2^-9 relative) is the only error beyond f32's, inside the
// bf16 tolerance; the softmax's sum l adds the unrounded weights.
//
// Shapes: blocks of kA cache elements (keys or dims) x kB vectors of 16
// rows, kA * kB <= 24 accumulators, kA + kB loads per kA * kB vdpbf16ps.
//
// Dispatch: bf16 q with bf16 or fp8 e4m3fn latents where vdpbf16ps issues
// at the f32 FMA's rate (AMD Zen 4: twice its flops), mla_kernel.h.
#include "mla/mla_kernel.h"

#if defined(__x86_64__)
#include "kernel/avx512_common.h"

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

template <int kA, int kB>
RPA_MLA_BF16_TARGET void PairBlock(const PairGemm& g, int64_t a0, int64_t b0) {
  __m512 acc[kA][kB];
  for (int a = 0; a < kA; ++a) {
    for (int b = 0; b < kB; ++b) {
      acc[a][b] = g.accumulate ? _mm512_loadu_ps(g.out + (a0 + a) * g.out_a_step + (b0 + b) * 16)
                               : _mm512_setzero_ps();
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
    for (int64_t k = 0; k < seg.k_count; ++k) {
      __m512i yv[kB];
      for (int b = 0; b < kB; ++b) yv[b] = _mm512_loadu_si512(y + k * seg.y_k_step + b * 32);
      for (int a = 0; a < kA; ++a) {
        int32_t pair;
        std::memcpy(&pair, x[a] + k * seg.x_k_step, sizeof(pair));
        const __m512bh xb = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
        for (int b = 0; b < kB; ++b) {
          acc[a][b] = _mm512_dpbf16_ps(acc[a][b], xb, reinterpret_cast<__m512bh>(yv[b]));
        }
      }
    }
  }
  for (int a = 0; a < kA; ++a) {
    for (int b = 0; b < kB; ++b) {
      _mm512_storeu_ps(g.out + (a0 + a) * g.out_a_step + (b0 + b) * 16, acc[a][b]);
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

RPA_MLA_BF16_TARGET void PairProduct(const PairGemm& g, int64_t a_count, int64_t rows_pad) {
  const int64_t vectors = rows_pad / 16;
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

// q_pairs[p][r] = (qt[2p][r], qt[2p + 1][r]) in bf16: exact for bf16 q.
RPA_MLA_BF16_TARGET void PairsPrepareQ(const MlaKernelArgs& args) {
  const MlaScratch& s = *args.scratch;
  const int64_t pairs = (args.dim_ckv + args.dim_kpe) / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    for (int64_t r = 0; r < args.rows_pad; r += 16) {
      const __m512i v = InterleavePairs(_mm512_loadu_ps(s.qt + 2 * p * args.rows_pad + r),
                                        _mm512_loadu_ps(s.qt + (2 * p + 1) * args.rows_pad + r));
      _mm512_storeu_si512(s.q_pairs + (p * args.rows_pad + r) * 2, v);
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
// in the tile scratch (the row pointers then point there).
RPA_MLA_BF16_TARGET MlaTile PairsPrepareTile(const MlaKernelArgs& args, const MlaTile& rows) {
  if (rows.dtype == DType::kBF16) return rows;
  const MlaScratch& s = *args.scratch;
  const int64_t dim_qk = args.dim_ckv + args.dim_kpe;
  const avx512::Fp8Lut lut = avx512::LoadLut(avx512::Fp8TableOf(DType::kF8E4M3FN, false));
  uint16_t* tile = static_cast<uint16_t*>(s.tile);
  for (int64_t i = 0; i < rows.n; ++i) {
    uint16_t* row = tile + i * dim_qk;
    E4m3RowToBf16(static_cast<const uint8_t*>(rows.ckv[i]), args.dim_ckv, lut, row);
    E4m3RowToBf16(static_cast<const uint8_t*>(rows.kpe[i]), args.dim_kpe, lut,
                  row + args.dim_ckv);
    s.ckv_rows[i] = row;
    s.kpe_rows[i] = row + args.dim_ckv;
  }
  return MlaTile{DType::kBF16, rows.n, s.ckv_rows, s.kpe_rows};
}

RPA_MLA_BF16_TARGET void PairsLogits(const MlaKernelArgs& args, const MlaTile& tile) {
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
  g.seg[0] = PairSegment{nullptr,  values, 2, 2 * args.dim_ckv, weights, 2 * args.rows_pad,
                         (tile.n + 1) / 2};
  g.num_segs = 1;
  g.out = s.acc;
  g.out_a_step = args.rows_pad;
  g.accumulate = true;
  PairProduct(g, args.dim_ckv, args.rows_pad);
}

}  // namespace

const MlaKernel kMlaAvx512Bf16Pairs = {"mla_avx512_bf16_pairs", /*e4m3_scaled=*/false,
                                       PairsPrepareQ, PairsPrepareTile, PairsLogits, PairsPv};

}  // namespace rpa::internal

#endif  // __x86_64__
