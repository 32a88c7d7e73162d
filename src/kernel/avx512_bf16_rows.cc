// The AVX-512 BF16 pair kernels for decode and the middle class: both
// products by vdpbf16ps (pairs of bf16 multiplied and summed into f32
// lanes) straight from the cache's rows, nothing packed.
//
// Arithmetic:
//   logits  q_r . k_t: a 32-bit lane of 32 loaded bf16 holds dims 2i and
//           2i + 1 of K's row, which is already the pair vdpbf16ps wants;
//           q rows are bf16 (kBf16) in the same order. Blocks of 4 rows x
//           4 keys (2 x 8, 1 x 16 for 1-2 q heads per kv head) keep 16
//           accumulators of 16 partial sums each, reduced by one
//           transpose-and-add tree (avx512_common.h's BlockLogits).
//   PV      acc_r += sum_t p[r][t] v_t: vdpbf16ps needs key pairs in a
//           lane, so two V rows t, t + 1 are interleaved in registers
//           (vpunpck{l,h}wd): the low vector holds dims 8L + 0..3 of each
//           128-bit lane L, the high one dims 8L + 4..7, and the
//           accumulators keep that order (AccOrder::kPairInterleaved,
//           PairAccIndex), which the task loop undoes once per task. The
//           weights are rounded to bf16 (nearest even) as the prefill
//           kernels round them; l sums the unrounded weights.
//   fp8     e4m3fn and e5m2 become bf16 by two vpermi2w table lookups per 32
//           codes in registers (exact; e4m3fn at its true value); int8 by
//           sign extension and conversion through f32 (exact: 8 bits).
// Against the FMA kernels (avx512_wide.cc) this halves the multiply-add
// instructions and needs no widening: on Zen 4, vdpbf16ps issues as often
// as the f32 FMA (CpuFeatures::fast_bf16_dot), so decode's arithmetic drops
// below its memory time (docs/kernel.md, Dispatch).
//
// Error: the logits are exact bf16 products summed in f32 (as the FMA
// kernels' f32 sums of the same products); the weights' bf16 rounding is
// the prefill kernels' and sits inside the bf16 tolerance (docs/contract.md).
//
// Dispatch chooses it for bf16 q over bf16, 8-bit float or int8 K/V with fewer
// than kPackedMinRows rows per kv head where vdpbf16ps runs at full rate;
// its fused tile (kAvx512Bf16Decode) for decode tiles every row sees whole.
#include "kernel/avx512_bf16_rows.h"

#if defined(__x86_64__)
#include <cstring>

#include "kernel/avx512_common.h"

namespace rpa::internal {
namespace avx512 {
namespace {

// The logits of a kRows x kTokens block (kRows * kTokens = 16) of key rows
// k[t]: lane r * kTokens + t of the result is q_r . k_t. q rows are bf16,
// zero padded to a multiple of 32 dims.
template <int kRows, int kTokens, DType kDtype>
RPA_AVX512_BF16_TARGET __attribute__((always_inline)) inline __m512 PairLogitsVector(
    const uint16_t* const* q, const void* const* k, const RowReader<kDtype>& read) {
  const int64_t head_dim = read.head_dim;
  static_assert(kRows * kTokens == 16);
  __m512 acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  // One 32-dim chunk of every row and key (kWhole: no tail, unmasked loads).
  auto chunk = [&]<bool kWhole>(int64_t d) RPA_AVX512_BF16_TARGET {
    const __mmask32 mask = kWhole ? ~__mmask32{0} : ChunkMask(d, head_dim);
    __m512i keys[kTokens];
#pragma GCC unroll 16
    for (int t = 0; t < kTokens; ++t) keys[t] = read.template Chunk<kWhole>(k[t], d, mask);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512i qr = _mm512_loadu_si512(q[r] + d);
#pragma GCC unroll 16
      for (int t = 0; t < kTokens; ++t) {
        acc[r * kTokens + t] = DotBf16(acc[r * kTokens + t], qr, keys[t]);
      }
    }
  };
  int64_t d = 0;
  for (; d + 32 <= head_dim; d += 32) chunk.template operator()<true>(d);
  if (d < head_dim) chunk.template operator()<false>(d);
  return BlockLogits(acc);
}

// The logits of rows [r, r + kRows) x keys [t, t + kTokens) that exist.
template <int kRows, int kTokens, DType kDtype>
RPA_AVX512_BF16_TARGET void PairLogitsBlock(const QueryRows& q, const KvTile& tile, int64_t r,
                                            int64_t t, const TileLogits& s,
                                            const RowReader<kDtype>& read) {
  const void* keys[kTokens];
#pragma GCC unroll 16
  for (int i = 0; i < kTokens; ++i) keys[i] = tile.k[t + i < tile.n ? t + i : t];
  const uint16_t* q_rows[kRows];
  const uint16_t* q0 = static_cast<const uint16_t*>(q.data) + r * q.stride;
#pragma GCC unroll 4
  for (int i = 0; i < kRows; ++i) q_rows[i] = q0 + (r + i < q.rows ? i : 0) * q.stride;
  StoreLogitsBlock<kRows, kTokens>(
      PairLogitsVector<kRows, kTokens, kDtype>(q_rows, keys, read), q.rows - r,
      tile.n - t, s.s + r * s.stride + t, s.stride);
}

// Where a row's bf16 weight pair j (keys 2j, 2j + 1) lives.
enum class WeightLayout : uint8_t {
  kRows,     // Row r's bf16 weights at w + r * w_stride, key t at element t.
  kBlocked,  // The fused tile's: blocks of 4 keys x 4 rows, element r * 4 + t % 4 of block t / 4.
};

// A PV pass (accumulators kPairInterleaved) on bf16 weights (WeightLayout;
// key n's, if n is odd, 0).
using PairPvPass = PvPass<uint16_t>;

template <WeightLayout kLayout>
__attribute__((always_inline)) inline const uint16_t* WeightPair(const PairPvPass& a, int64_t r,
                                                                 int64_t j) {
  if constexpr (kLayout == WeightLayout::kBlocked) return a.w + 16 * (j >> 1) + 4 * r + 2 * (j & 1);
  return a.w + r * a.w_stride + 2 * j;
}

// A pass over kRows rows and the kChunks 32-dim chunks from d0 (4 kRows *
// kChunks accumulators: 16 at 4 rows x 2 chunks). Per key pair, each chunk
// of the two V rows is interleaved once and feeds every row.
template <int kRows, int kChunks, DType kDtype, WeightLayout kLayout>
RPA_AVX512_BF16_TARGET void PairPvBlock(const PairPvPass& a, const RowReader<kDtype>& reader,
                                        int64_t d0, bool prefetch) {
  static_assert(kLayout == WeightLayout::kRows || kRows == 4);
  const RowReader<kDtype> read = reader;  // The table in registers, not reloaded per key.
  const KvRows pf = prefetch && a.prefetch != nullptr ? *a.prefetch : KvRows{};
  __mmask32 mask[kChunks];
  for (int c = 0; c < kChunks; ++c) mask[c] = ChunkMask(d0 + 32 * c, a.head_dim);
  int64_t row[kRows];  // Rows past a.rows repeat row 0; nothing of theirs is stored.
  for (int r = 0; r < kRows; ++r) row[r] = r < a.rows ? r : 0;
  __m512 lo[kChunks][kRows], hi[kChunks][kRows];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
    const float* acc = a.acc + row[r] * a.acc_stride + d0;
    const __m512 alpha = _mm512_set1_ps(a.alpha != nullptr ? a.alpha[row[r]] : 1.0f);
#pragma GCC unroll 2
    for (int c = 0; c < kChunks; ++c) {
      lo[c][r] = _mm512_mul_ps(_mm512_loadu_ps(acc + 32 * c), alpha);
      hi[c][r] = _mm512_mul_ps(_mm512_loadu_ps(acc + 32 * c + 16), alpha);
    }
  }
  // Keys t and t + 1 (a zero row where t + 1 == n) into every row.
  auto pair = [&](int64_t t, bool partner) RPA_AVX512_BF16_TARGET {
    __m512i vlo[kChunks], vhi[kChunks];
#pragma GCC unroll 2
    for (int c = 0; c < kChunks; ++c) {
      const __m512i v0 = read.Chunk(a.v[t], d0 + 32 * c, mask[c]);
      const __m512i v1 =
          partner ? read.Chunk(a.v[t + 1], d0 + 32 * c, mask[c]) : _mm512_setzero_si512();
      vlo[c] = _mm512_unpacklo_epi16(v0, v1);
      vhi[c] = _mm512_unpackhi_epi16(v0, v1);
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512i w = BroadcastPair(WeightPair<kLayout>(a, row[r], t >> 1));
#pragma GCC unroll 2
      for (int c = 0; c < kChunks; ++c) {
        lo[c][r] = DotBf16(lo[c][r], w, vlo[c]);
        hi[c][r] = DotBf16(hi[c][r], w, vhi[c]);
      }
    }
  };
  int64_t t = 0;
  for (; t + 2 <= a.n; t += 2) {
    if (t < pf.count) PrefetchRows(pf, t, 2, a.prefetch_bytes);
    pair(t, true);
  }
  if (t < a.n) {
    if (t < pf.count) PrefetchRows(pf, t, 2, a.prefetch_bytes);
    pair(t, false);
  }
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
    if (r >= a.rows) continue;
    float* acc = a.acc + r * a.acc_stride + d0;
#pragma GCC unroll 2
    for (int c = 0; c < kChunks; ++c) {
      _mm512_storeu_ps(acc + 32 * c, lo[c][r]);
      _mm512_storeu_ps(acc + 32 * c + 16, hi[c][r]);
    }
  }
}

// One row block's PV over the whole head (ForEachPvChunks).
template <int kRows, DType kDtype, WeightLayout kLayout>
RPA_AVX512_BF16_TARGET void PairPvRows(const PairPvPass& a, const RowReader<kDtype>& read) {
  ForEachPvChunks(a.head_dim, [&]<int kChunks>(int64_t d0, bool first) RPA_AVX512_BF16_TARGET {
    PairPvBlock<kRows, kChunks, kDtype, kLayout>(a, read, d0, first);
  });
}

template <DType kDtype>
RPA_AVX512_BF16_TARGET void LogitsImpl(const QueryRows& q, const KvTile& tile,
                                       const TileLogits& s) {
  const RowReader<kDtype> read(tile.head_dim);
  ForEachLogitsBlock(q.rows, tile, [&]<int kRows, int kTokens>(int64_t r, int64_t t)
                                       RPA_AVX512_BF16_TARGET {
    PairLogitsBlock<kRows, kTokens, kDtype>(q, tile, r, t, s, read);
  });
}

template <DType kDtype>
RPA_AVX512_BF16_TARGET void PvImpl(const TileLogits& p, const KvTile& tile,
                                   const SoftmaxState& state) {
  RowWeightsToBf16(p, tile.n);
  PairPvPass a = PvPassOver<uint16_t>(tile, state);
  a.w = reinterpret_cast<const uint16_t*>(p.s);
  a.w_stride = 2 * p.stride;
  const RowReader<kDtype> read(tile.head_dim);
  PvAllRows(a, p.rows, [&]<int kRows>(const PairPvPass& block) RPA_AVX512_BF16_TARGET {
    PairPvRows<kRows, kDtype, WeightLayout::kRows>(block, read);
  });
}

template <DType kDtype>
RPA_AVX512_BF16_TARGET bool DecodeTileImpl(const QueryRows& q_rows, const KvTile& tile,
                                           float logit_scale, const SoftmaxState& state) {
  const RowReader<kDtype> read(tile.head_dim);
  const __m512 scale = _mm512_set1_ps(logit_scale);
  const int64_t rows = q_rows.rows;
  const uint16_t* q[4];
  FusedQueryRows(q_rows, q);
  // Logits, then weights, in blocks of 4 keys: lane r * 4 + t = (row r, key 4b + t).
  alignas(64) float w[kFusedMaxKeys / 4 * 16];
  DecodeTileState next;
  const auto block = [&](const void* const* k) RPA_AVX512_BF16_TARGET {
    return _mm512_mul_ps(PairLogitsVector<4, 4, kDtype>(q, k, read), scale);
  };
  if (!DecodeTileWeights(tile, rows, block, state, w, &next)) return false;
  // The weights as bf16 in the same blocks (keys past n are 0).
  alignas(64) uint16_t wb[kFusedMaxKeys / 4 * 16];
  for (int64_t b = 0; 4 * b < tile.n; ++b) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(wb + 16 * b),
                       reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_load_ps(w + 16 * b))));
  }
  PairPvPass a = PvPassOver<uint16_t>(tile, state);
  a.w = wb;
  a.rows = rows;
  a.alpha = next.alpha;
  PairPvRows<4, kDtype, WeightLayout::kBlocked>(a, read);
  return true;
}

// The instances for K/V of kDtype (RowReader: bf16 read as is, 8-bit floats
// through their exact table, e4m3fn at its true value, int8 through f32).
template <DType kDtype>
void Logits(const QueryRows& q, const KvTile& tile, const TileLogits& s,
            const TileScratch& /*scratch*/) {
  if (q.rows <= 0 || tile.n <= 0) return;
  LogitsImpl<kDtype>(q, tile, s);
}

template <DType kDtype>
void Pv(const TileLogits& p, const KvTile& tile, const SoftmaxState& state,
        const TileScratch& /*scratch*/) {
  if (p.rows <= 0 || tile.n <= 0) return;
  PvImpl<kDtype>(p, tile, state);
}

template <DType kDtype>
bool DecodeTile(const QueryRows& q, const KvTile& tile, float logit_scale,
                const SoftmaxState& state) {
  return DecodeTileImpl<kDtype>(q, tile, logit_scale, state);
}

template <DType kDtype>
constexpr ProductKernel kRows = {"avx512_bf16_rows",    QueryFormat::kBf16,
                                 PrepareBf16Row,        AccOrder::kPairInterleaved,
                                 /*e4m3_scaled=*/false, /*prepare_tile=*/nullptr,
                                 Logits<kDtype>,        Pv<kDtype>};

template <DType kDtype>
constexpr FusedTileKernel kDecode = {
    "avx512_bf16_decode", QueryFormat::kBf16, PrepareBf16Row, AccOrder::kPairInterleaved,
    /*e4m3_scaled=*/false,
    // Computes 4 rows whatever the group: below 3 the unfused products cost less.
    /*min_rows=*/3, /*max_rows=*/4, DecodeTile<kDtype>};

}  // namespace
}  // namespace avx512

const ProductKernel* Avx512Bf16Rows(DType kv_dtype) {
  return KernelForKvDtype<ProductKernel, DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2,
                          DType::kI8>(kv_dtype,
                                      []<DType kDtype>() { return &avx512::kRows<kDtype>; });
}

const FusedTileKernel* Avx512Bf16Decode(DType kv_dtype) {
  return KernelForKvDtype<FusedTileKernel, DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2,
                          DType::kI8>(kv_dtype,
                                      []<DType kDtype>() { return &avx512::kDecode<kDtype>; });
}

}  // namespace rpa::internal

#endif  // __x86_64__
