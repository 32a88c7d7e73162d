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
//           avx512_bf16_rows: the first 4-row block interleaves the tile's V
//           rows in key pairs (vpunpck{l,h}wd, AccOrder::kPairInterleaved)
//           and stores them, so the later blocks read dense pairs from L1
//           instead of rows a token (4 KiB) apart, which share L1 sets. The
//           weights are rounded to bf16 (nearest even) as in every bf16-pair
//           kernel.
//   8-bit   fp8 (e4m3fn at its true value, e5m2) and int8 K/V become bf16
//           exactly (RowReader): K rows into a dense bf16 copy per tile
//           (scratch, or the fused tile's stack), whose pairs the logits
//           broadcast; V chunks in registers in the first PV block.
//   fused   (avx512_bf16_lanes_tile) S^T and the weights stay in vectors,
//           lane = row, between the products: the online softmax is
//           lane-wise, with no loop over rows and no trip through s.
// Against avx512_bf16_rows (4 x 4 blocks of row . key dot products reduced
// by a transpose-and-add tree, V rows re-read per 4-row block) both products
// take about 0.6 of the time for 16 rows on Zen 5, and with the fused tile
// the verification step takes about two thirds of the rows kernel's
// (docs/kernel_log.md, 2026-12-07).
//
// Error: the rows kernel's bound (the same bf16 products summed in f32,
// in another order; the same bf16 weights).
//
// Dispatch chooses it for bf16 q over bf16, 8-bit float or int8 K/V in the
// middle class where vdpbf16ps runs at full rate.
#include "kernel/avx512_bf16_lanes.h"

#if defined(__x86_64__)
#include <algorithm>

#include "kernel/avx512_common.h"
#include "kernel/bf16_pairs.h"

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

// The tile's K rows as bf16 rows: bf16 as they are; 8-bit K/V converted
// exactly (RowReader: e4m3fn at its true value, zero past head_dim) into
// out [n][dim_pad], row i's pointer in pointers[i].
template <DType kDtype>
RPA_AVX512_BF16_TARGET KvRows KeysAsBf16(const KvTile& tile, uint16_t* out,
                                         const uint8_t** pointers) {
  if constexpr (kDtype == DType::kBF16) {
    return tile.k;
  } else {
    const RowReader<kDtype> read(tile.head_dim);
    const int64_t dim_pad = RoundUp(tile.head_dim, kDimAlign);
    for (int64_t i = 0; i < tile.n; ++i) {
      uint16_t* row = out + i * dim_pad;
      for (int64_t d = 0; d < dim_pad; d += 32) _mm512_storeu_si512(row + d, read(tile.k[i], d));
      pointers[i] = reinterpret_cast<const uint8_t*>(row);
    }
    return KvRows{pointers, 0, tile.n};
  }
}

// Keys outside, row blocks inside: a step's 8 K rows (a token, 4 KiB, apart
// in the cache) are read from L2 once for both row blocks of 17-31 rows.
template <DType kDtype>
RPA_AVX512_BF16_TARGET void LogitsImpl(const QueryRows& q, KvTile tile, const TileLogits& s,
                                       const TileScratch& scratch) {
  tile.k = KeysAsBf16<kDtype>(tile, scratch.kv_bf16, scratch.converted);
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

// One PV pass: kRows accumulator rows (kPairInterleaved) += sum_t p[r][t]
// v_t over kChunks 32-dim chunks from d0. V in key pairs: pair row t / 2,
// each 32-dim chunk as vpunpcklwd then vpunpckhwd of rows t and t + 1 (a
// zero row past n, zero dims past head_dim), [RoundUp(n, 2) / 2][dim_pad]
// uint32. The first row block's passes (kFromRows) interleave the tile's V
// rows in registers and store the pairs; the later blocks read them, dense
// in L1, instead of the rows again (a token, 4 KiB, apart: they share L1
// sets).
struct LanePvPass {
  // The bf16 weights of row r, keys 2j and 2j + 1, as one 32-bit pair at
  // w + r * w_row_stride + j * w_pair_stride (uint16_t elements).
  const uint16_t* w = nullptr;
  int64_t w_row_stride = 0;
  int64_t w_pair_stride = 2;
  KvRows v;                   // [n] the tile's V rows.
  int64_t n = 0;
  int64_t head_dim = 0;
  int64_t row_bytes = 0;
  uint32_t* pairs = nullptr;  // [RoundUp(n, 2) / 2][dim_pad] V in key pairs.
  int64_t dim_pad = 0;
  float* acc = nullptr;  // [kRows, acc_stride]
  int64_t acc_stride = 0;
  const float* alpha = nullptr;  // [kRows] scales each acc row first; null: none.
  KvRows v_next;                 // The next tile's V rows, prefetched by the first pass.
};

template <int kRows, int kChunks, bool kFromRows, DType kDtype>
RPA_AVX512_BF16_TARGET void LanePvBlock(const LanePvPass& a, int64_t d0) {
  const RowReader<kDtype> read(a.head_dim);
  __m512 lo[kChunks][kRows], hi[kChunks][kRows];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
    const __m512 alpha = _mm512_set1_ps(a.alpha != nullptr ? a.alpha[r] : 1.0f);
#pragma GCC unroll 2
    for (int c = 0; c < kChunks; ++c) {
      lo[c][r] = _mm512_mul_ps(_mm512_loadu_ps(a.acc + r * a.acc_stride + d0 + 32 * c), alpha);
      hi[c][r] =
          _mm512_mul_ps(_mm512_loadu_ps(a.acc + r * a.acc_stride + d0 + 32 * c + 16), alpha);
    }
  }
  for (int64_t p = 0; 2 * p < a.n; ++p) {
    uint32_t* v = a.pairs + p * a.dim_pad + d0;
    __m512i vlo[kChunks], vhi[kChunks];
#pragma GCC unroll 2
    for (int c = 0; c < kChunks; ++c) {
      if constexpr (kFromRows) {
        if (d0 == 0 && c == 0) PrefetchRows(a.v_next, 2 * p, 2, a.row_bytes);
        const int64_t d = d0 + 32 * c;
        const __m512i x = read(a.v[2 * p], d);
        const __m512i y = 2 * p + 1 < a.n ? read(a.v[2 * p + 1], d) : _mm512_setzero_si512();
        vlo[c] = _mm512_unpacklo_epi16(x, y);
        vhi[c] = _mm512_unpackhi_epi16(x, y);
        _mm512_storeu_si512(v + 32 * c, vlo[c]);
        _mm512_storeu_si512(v + 32 * c + 16, vhi[c]);
      } else {
        vlo[c] = _mm512_loadu_si512(v + 32 * c);
        vhi[c] = _mm512_loadu_si512(v + 32 * c + 16);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512i w = BroadcastPair(a.w + r * a.w_row_stride + p * a.w_pair_stride);
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

// A row block's passes over the whole head (ForEachPvChunks: 64 dims each,
// a last 32-dim one where the chunk count is odd).
template <int kRows, bool kFromRows, DType kDtype>
RPA_AVX512_BF16_TARGET void LanePvRows(const LanePvPass& a) {
  ForEachPvChunks(a.dim_pad, [&]<int kChunks>(int64_t d0, bool /*first*/) RPA_AVX512_BF16_TARGET {
    LanePvBlock<kRows, kChunks, kFromRows, kDtype>(a, d0);
  });
}

// PV of `rows` rows in blocks of 4, 2 and 1 rows; the first block reads the
// V rows (and prefetches the next tile's), the others the pairs it stored.
template <DType kDtype>
RPA_AVX512_BF16_TARGET void LanePvAllRows(const LanePvPass& a, int64_t rows) {
  if (a.v_next.count > RoundUp(a.n, 2)) {
    PrefetchRows(a.v_next, RoundUp(a.n, 2), a.v_next.count, a.row_bytes);
  }
  ForEachPvRowBlock(rows, [&]<int kRows>(int64_t r, bool first) RPA_AVX512_BF16_TARGET {
    LanePvPass block = a;
    block.w += r * a.w_row_stride;
    block.acc += r * a.acc_stride;
    if (a.alpha != nullptr) block.alpha += r;
    if (first) {
      LanePvRows<kRows, true, kDtype>(block);
    } else {
      LanePvRows<kRows, false, kDtype>(block);
    }
  });
}

// A pass over the tile's V rows into the state's accumulators, prefetching
// the next tile's, the pairs in `pairs`; the weights and alpha are the caller's.
LanePvPass LanePassOver(const KvTile& tile, const SoftmaxState& state, uint32_t* pairs) {
  LanePvPass a;
  a.v = tile.v;
  a.n = tile.n;
  a.head_dim = tile.head_dim;
  a.row_bytes = tile.row_bytes;
  a.pairs = pairs;
  a.dim_pad = RoundUp(tile.head_dim, kDimAlign);
  a.acc = state.acc;
  a.acc_stride = state.stride;
  a.v_next = tile.v_next;
  return a;
}

template <DType kDtype>
RPA_AVX512_BF16_TARGET void PvImpl(const TileLogits& p, const KvTile& tile,
                                   const SoftmaxState& state, const TileScratch& scratch) {
  RowWeightsToBf16(p, tile.n);
  LanePvPass a = LanePassOver(tile, state, reinterpret_cast<uint32_t*>(scratch.packed));
  a.w = reinterpret_cast<const uint16_t*>(p.s);
  a.w_row_stride = 2 * p.stride;
  LanePvAllRows<kDtype>(a, p.rows);
}

// ---- The fused tile: up to 16 rows (one block of lanes) over a tile of at
// most kFusedMaxKeys keys every row sees, S^T and its weights kept in
// vectors (lane = row) between the products, so the softmax is
// lane-wise: no row loop, no transpose, no trip through s.

// The stack's V pairs hold heads of up to this many (padded) dims; wider
// ones are declined to the products.
constexpr int64_t kTileMaxDimPad = 256;

// The online-softmax update of 16 lane rows (row_lanes valid) from the
// tile's scaled logits x[0, n): x becomes the weights e^(x - m_new), m and
// l are updated and *alpha = e^(m_old - m_new). False, with nothing
// written, where a NaN (in x or m) or a maximum that is not finite needs
// SoftmaxRow's rules (FusedSoftmaxFollows, as the decode tiles decline).
RPA_AVX512_BF16_TARGET __attribute__((always_inline)) inline bool LaneSoftmax(
    __m512* x, int64_t n, __mmask16 row_lanes, const SoftmaxState& state, __m512* alpha) {
  // Four partial maxima and sums: one chain of 32 dependent max or add
  // instructions would take longer than the exp.
  // x past n up to a multiple of 4 is -inf: no maximum, weight 0.
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  const int64_t n4 = RoundUp(n, 4);
  for (int64_t t = n; t < n4; ++t) x[t] = neg_inf;
  __m512 part[4] = {neg_inf, neg_inf, neg_inf, neg_inf};
  __mmask16 nan = 0;
  for (int64_t t = 0; t < n4; t += 4) {
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      nan |= _mm512_cmp_ps_mask(x[t + i], x[t + i], _CMP_UNORD_Q);
      part[i] = _mm512_max_ps(part[i], x[t + i]);
    }
  }
  const __m512 vmax =
      _mm512_max_ps(_mm512_max_ps(part[0], part[1]), _mm512_max_ps(part[2], part[3]));
  const __m512 m_old = _mm512_maskz_loadu_ps(row_lanes, state.m);
  const __m512 m_new = _mm512_max_ps(m_old, vmax);
  if (!FusedSoftmaxFollows(nan, m_old, m_new, row_lanes)) return false;
  *alpha = ExpNonPositive(_mm512_sub_ps(m_old, m_new));  // m_old = -inf: 0.
  for (int i = 0; i < 4; ++i) part[i] = _mm512_setzero_ps();
  for (int64_t t = 0; t < n4; t += 4) {
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      x[t + i] = ExpNonPositive(_mm512_sub_ps(x[t + i], m_new));
      part[i] = _mm512_add_ps(part[i], x[t + i]);
    }
  }
  const __m512 sum =
      _mm512_add_ps(_mm512_add_ps(part[0], part[1]), _mm512_add_ps(part[2], part[3]));
  const __m512 l_old = _mm512_maskz_loadu_ps(row_lanes, state.l);
  _mm512_mask_storeu_ps(state.m, row_lanes, m_new);
  _mm512_mask_storeu_ps(state.l, row_lanes, _mm512_fmadd_ps(l_old, *alpha, sum));
  return true;
}

// Weights x[0, n) (lane = row) as bf16 pairs: w[j] lane r = (x[2j][r],
// x[2j + 1][r]) rounded to nearest even, the partner of key n - 1 zero where
// n is odd.
RPA_AVX512_BF16_TARGET __attribute__((always_inline)) inline void LaneWeightPairs(
    const __m512* x, int64_t n, __m512i* w) {
  // Word 2r of the result from word r (x[2j]), word 2r + 1 from word 16 + r.
  alignas(64) static constexpr uint16_t kInterleave[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i index = _mm512_load_si512(kInterleave);
  for (int64_t j = 0; 2 * j < n; ++j) {
    const __m512 partner = 2 * j + 1 < n ? x[2 * j + 1] : _mm512_setzero_ps();
    const __m512i halves = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(partner, x[2 * j]));
    w[j] = _mm512_permutexvar_epi16(index, halves);
  }
}

template <DType kDtype>
RPA_AVX512_BF16_TARGET bool LanesTileImpl(const QueryRows& q, const KvTile& tile,
                                          float logit_scale, const SoftmaxState& state) {
  const int64_t n = tile.n, dim_pad = RoundUp(tile.head_dim, kDimAlign);
  if (q.rows > kQueryLanes || n > kFusedMaxKeys || dim_pad > kTileMaxDimPad) return false;
  // 8-bit K as bf16 rows (bf16: the cache's rows as they are).
  alignas(64) uint16_t k_bf16[kDtype == DType::kBF16 ? 1 : kFusedMaxKeys * kTileMaxDimPad];
  const uint8_t* k_pointers[kFusedMaxKeys];
  const KvRows keys = KeysAsBf16<kDtype>(tile, k_bf16, k_pointers);
  // Logits, 8 keys a step, scaled.
  __m512 x[kFusedMaxKeys];
  if (tile.k_next.count > RoundUp(n, kKeysPerStep)) {
    PrefetchRows(tile.k_next, RoundUp(n, kKeysPerStep), tile.k_next.count, tile.row_bytes);
  }
  const __m512 scale = _mm512_set1_ps(logit_scale);
  for (int64_t t = 0; t < n; t += kKeysPerStep) {
    PrefetchRows(tile.k_next, t, kKeysPerStep, tile.row_bytes);
    const uint16_t* k[kKeysPerStep];  // Keys past n repeat the last; not used.
    for (int i = 0; i < kKeysPerStep; ++i) {
      k[i] = static_cast<const uint16_t*>(keys[std::min(t + i, n - 1)]);
    }
    __m512 step[kKeysPerStep];
    LaneLogitsStep(static_cast<const uint32_t*>(q.data), k, tile.head_dim, step);
    for (int64_t i = 0; i < kKeysPerStep && t + i < n; ++i) {
      x[t + i] = _mm512_mul_ps(step[i], scale);
    }
  }
  __m512 alpha;
  if (!LaneSoftmax(x, n, Lanes16(q.rows), state, &alpha)) return false;
  // PV from the weight pairs (w[j] lane r: row r's pair j) and the tile's V pairs.
  alignas(64) __m512i w[kFusedMaxKeys / 2];
  LaneWeightPairs(x, n, w);
  alignas(64) float alpha_rows[kQueryLanes];
  _mm512_store_ps(alpha_rows, alpha);
  alignas(64) uint32_t pairs[kFusedMaxKeys / 2 * kTileMaxDimPad];
  LanePvPass a = LanePassOver(tile, state, pairs);
  a.w = reinterpret_cast<const uint16_t*>(w);
  a.w_row_stride = 2;
  a.w_pair_stride = 2 * kQueryLanes;
  a.alpha = alpha_rows;
  LanePvAllRows<kDtype>(a, q.rows);
  return true;
}

template <DType kDtype>
void Logits(const QueryRows& q, const KvTile& tile, const TileLogits& s,
            const TileScratch& scratch) {
  if (q.rows > 0 && tile.n > 0) LogitsImpl<kDtype>(q, tile, s, scratch);
}

template <DType kDtype>
void Pv(const TileLogits& p, const KvTile& tile, const SoftmaxState& state,
        const TileScratch& scratch) {
  if (p.rows > 0 && tile.n > 0) PvImpl<kDtype>(p, tile, state, scratch);
}

template <DType kDtype>
bool LanesTile(const QueryRows& q, const KvTile& tile, float logit_scale,
               const SoftmaxState& state) {
  return LanesTileImpl<kDtype>(q, tile, logit_scale, state);
}

// The instances for K/V of kDtype (bf16, e4m3fn, e5m2, int8). prepare_q
// null: the task loop builds kBf16PairLanes from the kBf16 rows.
template <DType kDtype>
constexpr ProductKernel kLanes = {"avx512_bf16_lanes",    QueryFormat::kBf16PairLanes,
                                  nullptr,                AccOrder::kPairInterleaved,
                                  /*e4m3_scaled=*/false,  /*prepare_tile=*/nullptr,
                                  Logits<kDtype>,         Pv<kDtype>};

template <DType kDtype>
constexpr FusedTileKernel kLanesTile = {
    "avx512_bf16_lanes_tile", QueryFormat::kBf16PairLanes, nullptr, AccOrder::kPairInterleaved,
    /*e4m3_scaled=*/false,    /*min_rows=*/1,              /*max_rows=*/kQueryLanes,
    LanesTile<kDtype>};

}  // namespace
}  // namespace avx512

const ProductKernel* Avx512Bf16Lanes(DType kv_dtype) {
  return KernelForKvDtype<ProductKernel, DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2,
                          DType::kI8>(kv_dtype,
                                      []<DType kDtype>() { return &avx512::kLanes<kDtype>; });
}

const FusedTileKernel* Avx512Bf16LanesTile(DType kv_dtype) {
  return KernelForKvDtype<FusedTileKernel, DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2,
                          DType::kI8>(kv_dtype,
                                      []<DType kDtype>() { return &avx512::kLanesTile<kDtype>; });
}

}  // namespace rpa::internal

#endif  // __x86_64__
