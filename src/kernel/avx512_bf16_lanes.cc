// The AVX-512 BF16 pair kernel for the middle class (9-31 rows per kv head:
// GQA groups of several queries, speculative verification) with the query
// rows in the 16 lanes of a vector: each K element is read once for 16 rows
// and no sum crosses lanes.
//
// Arithmetic:
//   logits  S^T = K Q^T, 16 rows at a time. The rows are stored transposed
//           in pairs (QueryFormat::kBf16PairLanes: vector j holds dims 2j,
//           2j + 1 of 16 rows), and each key's pair j, read from its row in
//           the cache and broadcast, multiplies it (vdpbf16ps): a key's 16
//           logits sum in one vector. Two accumulators per key (even and odd
//           pairs) and 8 keys at a time give 16 independent chains, which
//           cover vdpbf16ps's latency (6 cycles at 2 a cycle on Zen 5).
//           Each 16 x 16 block is transposed into the rows of s.
//   PV      acc_r += sum_t p[r][t] v_t with the dimensions in lanes, as
//           avx512_bf16_rows: the tile's V rows are interleaved in key pairs
//           once (vpunpck{l,h}wd, AccOrder::kPairInterleaved) into scratch,
//           so the 4-row x 64-dim passes read dense pairs from L1 instead of
//           rows a token (4 KiB) apart, which share L1 sets. The weights are
//           rounded to bf16 (nearest even) as in every bf16-pair kernel.
// Against avx512_bf16_rows (4 x 4 blocks of row . key dot products reduced
// by a transpose-and-add tree, V rows re-read per 4-row block) both products
// take about 0.6 of the time for 16 rows on Zen 5 (docs/kernel_log.md).
//
// Error: the rows kernel's exactly (the same bf16 products summed in f32,
// in another order).
//
// Dispatch chooses it for bf16 q over bf16 K/V in the middle class where
// vdpbf16ps runs at full rate. 8-bit K/V stay on avx512_bf16_rows: a pair
// broadcast straight from their rows would need a conversion per pair.
#include "kernel/avx512_bf16_lanes.h"

#if defined(__x86_64__)
#include <algorithm>

#include "kernel/avx512_common.h"

namespace rpa::internal {
namespace avx512 {
namespace {

constexpr int kKeysPerStep = 8;   // Keys whose logits accumulate together.
constexpr int kPairsPerLoad = 8;  // Query pair vectors loaded at once.

// S^T of one block of 16 lane rows (q: [dim_pad / 2][16] pairs) and 8 keys:
// lane l of out[i] = q_l . k_i. Only the row's head_dim elements are read:
// an odd head_dim's last pair is its one element and a zero.
RPA_AVX512_BF16_TARGET __attribute__((always_inline)) inline void LaneLogitsStep(
    const uint32_t* q, const uint16_t* const* k, int64_t head_dim, __m512* out) {
  __m512 even[kKeysPerStep], odd[kKeysPerStep];
#pragma GCC unroll 8
  for (int i = 0; i < kKeysPerStep; ++i) even[i] = odd[i] = _mm512_setzero_ps();
  const int64_t whole = head_dim / 2;
  int64_t j = 0;
  for (; j + kPairsPerLoad <= whole; j += kPairsPerLoad) {
    __m512i qv[kPairsPerLoad];
#pragma GCC unroll 8
    for (int p = 0; p < kPairsPerLoad; ++p) qv[p] = _mm512_loadu_si512(q + (j + p) * kQueryLanes);
#pragma GCC unroll 8
    for (int p = 0; p < kPairsPerLoad; ++p) {
#pragma GCC unroll 8
      for (int i = 0; i < kKeysPerStep; ++i) {
        __m512& acc = p % 2 == 0 ? even[i] : odd[i];
        acc = DotBf16(acc, qv[p], BroadcastPair(k[i] + 2 * (j + p)));
      }
    }
  }
  for (; j < whole; ++j) {
    const __m512i qv = _mm512_loadu_si512(q + j * kQueryLanes);
#pragma GCC unroll 8
    for (int i = 0; i < kKeysPerStep; ++i) {
      even[i] = DotBf16(even[i], qv, BroadcastPair(k[i] + 2 * j));
    }
  }
  if (head_dim % 2 != 0) {
    const __m512i qv = _mm512_loadu_si512(q + j * kQueryLanes);
#pragma GCC unroll 8
    for (int i = 0; i < kKeysPerStep; ++i) {
      even[i] = DotBf16(even[i], qv, _mm512_set1_epi32(k[i][2 * j]));
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kKeysPerStep; ++i) out[i] = _mm512_add_ps(even[i], odd[i]);
}

// The logits of lane rows [r0, r0 + rows) (rows <= 16; q: their block) x
// keys [t0, t0 + 16) that exist, into s. `prefetch`: the next tile's K rows
// of these keys too.
RPA_AVX512_BF16_TARGET void LaneLogitsBlock(const uint32_t* q, int64_t r0, int64_t rows,
                                            const KvTile& tile, int64_t t0, const TileLogits& s,
                                            bool prefetch) {
  __m512 st[kQueryLanes];  // st[i] lane l: row l, key t0 + i.
  for (int half = 0; half < 2; ++half) {
    const int64_t t = t0 + kKeysPerStep * half;
    __m512* out = st + kKeysPerStep * half;
    if (t >= tile.n) {
      for (int i = 0; i < kKeysPerStep; ++i) out[i] = _mm512_setzero_ps();
      continue;
    }
    if (prefetch) PrefetchRows(tile.k_next, t, kKeysPerStep, tile.row_bytes);
    const uint16_t* k[kKeysPerStep];  // Keys past n repeat the last; not stored.
    for (int i = 0; i < kKeysPerStep; ++i) {
      k[i] = static_cast<const uint16_t*>(tile.k[std::min(t + i, tile.n - 1)]);
    }
    LaneLogitsStep(q, k, tile.head_dim, out);
  }
  __m512i rows_of[kQueryLanes];
  for (int i = 0; i < kQueryLanes; ++i) rows_of[i] = _mm512_castps_si512(st[i]);
  Transpose16x16(rows_of);
  const __mmask16 keys = Lanes16(tile.n - t0);
  for (int64_t r = 0; r < rows; ++r) {
    _mm512_mask_storeu_ps(s.s + (r0 + r) * s.stride + t0, keys, _mm512_castsi512_ps(rows_of[r]));
  }
}

// Keys outside, row blocks inside: a step's 8 K rows (a token, 4 KiB, apart
// in the cache) are read from L2 once for both row blocks of 17-31 rows.
RPA_AVX512_BF16_TARGET void LogitsImpl(const QueryRows& q, const KvTile& tile,
                                       const TileLogits& s) {
  const uint32_t* blocks = static_cast<const uint32_t*>(q.data);
  const int64_t block_elems = q.stride / 2 * kQueryLanes;
  if (tile.k_next.count > RoundUp(tile.n, kKeysPerStep)) {
    PrefetchRows(tile.k_next, RoundUp(tile.n, kKeysPerStep), tile.k_next.count, tile.row_bytes);
  }
  for (int64_t t0 = 0; t0 < tile.n; t0 += kQueryLanes) {
    for (int64_t r0 = 0; r0 < q.rows; r0 += kQueryLanes) {
      LaneLogitsBlock(blocks + r0 / kQueryLanes * block_elems, r0,
                      std::min(kQueryLanes, q.rows - r0), tile, t0, s, /*prefetch=*/r0 == 0);
    }
  }
}

// The tile's V rows interleaved in key pairs into out: pair row t / 2, each
// 32-dim chunk as vpunpcklwd then vpunpckhwd of rows t and t + 1 (a zero
// row past n; zero dims past head_dim): [RoundUp(n, 2) / 2][dim_pad] uint32.
// Prefetches the next tile's V rows, a pair's worth per pair.
RPA_AVX512_BF16_TARGET void PackValuePairs(const KvTile& tile, int64_t dim_pad, uint32_t* out) {
  const int64_t n = tile.n;
  if (tile.v_next.count > RoundUp(n, 2)) {
    PrefetchRows(tile.v_next, RoundUp(n, 2), tile.v_next.count, tile.row_bytes);
  }
  for (int64_t t = 0; t < n; t += 2) {
    PrefetchRows(tile.v_next, t, 2, tile.row_bytes);
    const auto* v0 = static_cast<const uint16_t*>(tile.v[t]);
    const auto* v1 = t + 1 < n ? static_cast<const uint16_t*>(tile.v[t + 1]) : nullptr;
    uint32_t* pair_row = out + t / 2 * dim_pad;
    for (int64_t d = 0; d < dim_pad; d += 32) {
      const __mmask32 mask = ChunkMask(d, tile.head_dim);
      const __m512i a = _mm512_maskz_loadu_epi16(mask, v0 + d);
      const __m512i b = v1 != nullptr ? _mm512_maskz_loadu_epi16(mask, v1 + d)
                                      : _mm512_setzero_si512();
      _mm512_storeu_si512(pair_row + d, _mm512_unpacklo_epi16(a, b));
      _mm512_storeu_si512(pair_row + d + 16, _mm512_unpackhi_epi16(a, b));
    }
  }
}

// One PV pass over packed value pairs: kRows accumulator rows
// (kPairInterleaved) += sum_t p[r][t] v_t over kChunks 32-dim chunks from d0.
struct LanePvPass {
  const uint16_t* w = nullptr;  // Row r's bf16 weights at w + r * w_stride (pairs of keys).
  int64_t w_stride = 0;
  const uint32_t* pairs = nullptr;  // PackValuePairs' output.
  int64_t num_pairs = 0;
  int64_t dim_pad = 0;
  float* acc = nullptr;  // [kRows, acc_stride]
  int64_t acc_stride = 0;
};

template <int kRows, int kChunks>
RPA_AVX512_BF16_TARGET void LanePvBlock(const LanePvPass& a, int64_t d0) {
  __m512 lo[kChunks][kRows], hi[kChunks][kRows];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 2
    for (int c = 0; c < kChunks; ++c) {
      lo[c][r] = _mm512_loadu_ps(a.acc + r * a.acc_stride + d0 + 32 * c);
      hi[c][r] = _mm512_loadu_ps(a.acc + r * a.acc_stride + d0 + 32 * c + 16);
    }
  }
  for (int64_t p = 0; p < a.num_pairs; ++p) {
    const uint32_t* v = a.pairs + p * a.dim_pad + d0;
    __m512i vlo[kChunks], vhi[kChunks];
#pragma GCC unroll 2
    for (int c = 0; c < kChunks; ++c) {
      vlo[c] = _mm512_loadu_si512(v + 32 * c);
      vhi[c] = _mm512_loadu_si512(v + 32 * c + 16);
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512i w = BroadcastPair(a.w + r * a.w_stride + 2 * p);
#pragma GCC unroll 2
      for (int c = 0; c < kChunks; ++c) {
        lo[c][r] = DotBf16(lo[c][r], w, vlo[c]);
        hi[c][r] = DotBf16(hi[c][r], w, vhi[c]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 2
    for (int c = 0; c < kChunks; ++c) {
      _mm512_storeu_ps(a.acc + r * a.acc_stride + d0 + 32 * c, lo[c][r]);
      _mm512_storeu_ps(a.acc + r * a.acc_stride + d0 + 32 * c + 16, hi[c][r]);
    }
  }
}

RPA_AVX512_BF16_TARGET void PvImpl(const TileLogits& p, const KvTile& tile,
                                   const SoftmaxState& state, const TileScratch& scratch) {
  RowWeightsToBf16(p, tile.n);
  auto* pairs = reinterpret_cast<uint32_t*>(scratch.packed);
  PackValuePairs(tile, scratch.dim_pad, pairs);
  LanePvPass a;
  a.w = reinterpret_cast<const uint16_t*>(p.s);
  a.w_stride = 2 * p.stride;
  a.pairs = pairs;
  a.num_pairs = RoundUp(tile.n, 2) / 2;
  a.dim_pad = scratch.dim_pad;
  a.acc = state.acc;
  a.acc_stride = state.stride;
  ForEachPvRowBlock(p.rows, [&]<int kRows>(int64_t r, bool /*first*/) RPA_AVX512_BF16_TARGET {
    LanePvPass block = a;
    block.w += r * a.w_stride;
    block.acc += r * a.acc_stride;
    int64_t d = 0;
    for (; d + 32 < a.dim_pad; d += 64) LanePvBlock<kRows, 2>(block, d);
    if (d < a.dim_pad) LanePvBlock<kRows, 1>(block, d);
  });
}

void Logits(const QueryRows& q, const KvTile& tile, const TileLogits& s,
            const TileScratch& /*scratch*/) {
  if (q.rows > 0 && tile.n > 0) LogitsImpl(q, tile, s);
}

void Pv(const TileLogits& p, const KvTile& tile, const SoftmaxState& state,
        const TileScratch& scratch) {
  if (p.rows > 0 && tile.n > 0) PvImpl(p, tile, state, scratch);
}

// prepare_q null: the task loop builds kBf16PairLanes from the kBf16 rows.
constexpr ProductKernel kLanes = {"avx512_bf16_lanes",    QueryFormat::kBf16PairLanes,
                                  nullptr,                AccOrder::kPairInterleaved,
                                  /*e4m3_scaled=*/false,  Logits,
                                  Pv};

}  // namespace
}  // namespace avx512

const ProductKernel* Avx512Bf16Lanes(DType kv_dtype) {
  return kv_dtype == DType::kBF16 ? &avx512::kLanes : nullptr;
}

}  // namespace rpa::internal

#endif  // __x86_64__
