// The attention kernel for one task, compiled once per Highway target
// (attention.cc includes this through hwy/foreach_target.h).
//
// A task's rows R = (query tokens of its tile) x (G q heads of its kv head).
// Per KV tile of n keys (row pointers k_i, v_i into the pages):
//   S[r][i] = (q_r . k_i) * sm_scale * k_scale      // Logits*
//   S = soft_cap ? c * tanh(S / c) : S; masked keys: -inf (skipped when
//   mask_value <= -1e4, SPEC §1) or S + mask_value
//   m' = max(m, max_i S[r][i]);  alpha = exp(m - m')
//   P[r][i] = exp(S[r][i] - m');  l = alpha * l + sum_i P[r][i]
//   acc_r = alpha * acc_r + sum_i P[r][i] * v_i       // Pv*
// and at the end out_r = acc_r * v_scale / l (0 when l == 0: no key visible).
// k_scale and v_scale are folded into the logit and output scale: q.(s k)
// = s (q.k), so K/V are never rescaled element by element.
//
// Logits and PV come in two flavours: the Highway f32-FMA loops below
// (K/V converted to f32 in registers) and, for bf16 K/V on CPUs with
// AVX-512 BF16, the vdpbf16ps loops of avx512_bf16.cc.

#if defined(RPA_SRC_KERNEL_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RPA_SRC_KERNEL_ATTENTION_INL_H_
#undef RPA_SRC_KERNEL_ATTENTION_INL_H_
#else
#define RPA_SRC_KERNEL_ATTENTION_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernel/kernel.h"
#include "problem.h"
#include "rpa/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace rpa::internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// hwy's storage type for a K/V dtype computed in f32.
template <DType kDtype>
using HwyElem = std::conditional_t<
    kDtype == DType::kF32, float,
    std::conditional_t<kDtype == DType::kBF16, hwy::bfloat16_t, hwy::float16_t>>;

// Storage tags of the 8-bit K/V dtypes, converted in registers (LoadF32).
struct E4M3Elem { uint8_t bits; };
struct E5M2Elem { uint8_t bits; };
struct I8Elem { int8_t bits; };

// The 8-bit floats are widened to f16 by moving bits, then to f32 by the
// hardware's f16 conversion (vcvtph2ps where the target has it):
// * e5m2 is the top byte of an f16 (same exponent bias 15): exact, inf and
//   NaN included.
// * e4m3fn (bias 7) shifted into f16's (bias 15) layout is its value times
//   2^-8, subnormals included; kE4M3Rescale (2^8) is folded into the logit
//   and output scales, so nothing is multiplied per element. Its NaN codes
//   (0x7F, 0xFF) would land on a finite f16, so they are set to NaN.
inline constexpr float kE4M3Rescale = 256.0f;

// Lanes [0, Lanes(df)) of a row, converted to f32 in registers.
template <typename T>
HWY_INLINE VF LoadF32(DF df, const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else if constexpr (std::is_same_v<T, I8Elem>) {
    const hn::Rebind<int8_t, DF> d8;
    const hn::Rebind<int32_t, DF> d32;
    return hn::ConvertTo(df, hn::PromoteTo(d32, hn::LoadU(d8, reinterpret_cast<const int8_t*>(p))));
  } else if constexpr (std::is_same_v<T, E5M2Elem> || std::is_same_v<T, E4M3Elem>) {
    const hn::Rebind<uint8_t, DF> d8;
    const hn::Rebind<uint16_t, DF> d16;
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto x = hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const uint8_t*>(p)));
    if constexpr (std::is_same_v<T, E5M2Elem>) {
      return hn::PromoteTo(df, hn::BitCast(dh, hn::ShiftLeft<8>(x)));
    } else {
      const auto magnitude = hn::And(x, hn::Set(d16, uint16_t{0x7F}));
      const auto bits = hn::Or(hn::ShiftLeft<7>(magnitude),
                               hn::ShiftLeft<8>(hn::And(x, hn::Set(d16, uint16_t{0x80}))));
      const VF f = hn::PromoteTo(df, hn::BitCast(dh, bits));
      const hn::Rebind<uint32_t, DF> du;
      const auto nan = hn::RebindMask(
          df, hn::Eq(hn::PromoteTo(du, magnitude), hn::Set(du, uint32_t{0x7F})));
      return hn::IfThenElse(nan, hn::Set(df, std::numeric_limits<float>::quiet_NaN()), f);
    }
  } else {
    const hn::Rebind<T, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, p));
  }
}

// The first `count` (< Lanes) elements, zeros after; reads nothing beyond.
template <typename T>
HWY_INLINE VF LoadF32Tail(DF df, const T* p, size_t count) {
  T buf[64];  // >= the most f32 lanes of any target here.
  std::memset(static_cast<void*>(buf), 0, sizeof(buf));
  std::memcpy(static_cast<void*>(buf), p, count * sizeof(T));
  return LoadF32(df, buf);
}

// dst[d] = f32 of src[d] for d < count, 0 for d in [count, count_pad);
// count_pad is a multiple of Lanes.
template <typename T>
HWY_INLINE void RowToF32(const T* src, int64_t count, int64_t count_pad, float* dst) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t d = 0; d < count_pad; d += lanes) {
    const int64_t left = std::clamp<int64_t>(count - d, 0, lanes);
    hn::StoreU(left == lanes ? LoadF32(df, src + d)
               : left > 0    ? LoadF32Tail(df, src + d, static_cast<size_t>(left))
                             : hn::Zero(df),
               df, dst + d);
  }
}

// S[r][t] = dot(q_r, k_t) for kRows rows. q rows are zero padded to
// dim_pad >= RoundUp(head_dim, Lanes).
template <int kRows, typename T>
HWY_INLINE void LogitsRows(const float* q, int64_t q_stride, const void* const* k_rows,
                           int64_t tokens, int64_t head_dim, float* s, int64_t s_stride) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t body = head_dim / lanes * lanes;
  for (int64_t t = 0; t < tokens; ++t) {
    const T* k = static_cast<const T*>(k_rows[t]);
    VF a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
    auto step = [&](int64_t d, VF kv) HWY_ATTR {
      a0 = hn::MulAdd(hn::LoadU(df, q + d), kv, a0);
      if constexpr (kRows > 1) a1 = hn::MulAdd(hn::LoadU(df, q + q_stride + d), kv, a1);
      if constexpr (kRows > 2) a2 = hn::MulAdd(hn::LoadU(df, q + 2 * q_stride + d), kv, a2);
      if constexpr (kRows > 3) a3 = hn::MulAdd(hn::LoadU(df, q + 3 * q_stride + d), kv, a3);
    };
    for (int64_t d = 0; d < body; d += lanes) step(d, LoadF32(df, k + d));
    if (body < head_dim) {
      step(body, LoadF32Tail(df, k + body, static_cast<size_t>(head_dim - body)));
    }
    s[t] = hn::GetLane(hn::SumOfLanes(df, a0));
    if constexpr (kRows > 1) s[s_stride + t] = hn::GetLane(hn::SumOfLanes(df, a1));
    if constexpr (kRows > 2) s[2 * s_stride + t] = hn::GetLane(hn::SumOfLanes(df, a2));
    if constexpr (kRows > 3) s[3 * s_stride + t] = hn::GetLane(hn::SumOfLanes(df, a3));
  }
}

template <typename T>
HWY_NOINLINE void Logits(const float* q, int64_t q_stride, int64_t rows,
                         const void* const* k_rows, int64_t tokens, int64_t head_dim, float* s,
                         int64_t s_stride) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    LogitsRows<4, T>(q + r * q_stride, q_stride, k_rows, tokens, head_dim, s + r * s_stride,
                     s_stride);
  }
  const float* qr = q + r * q_stride;
  float* sr = s + r * s_stride;
  switch (rows - r) {
    case 3: LogitsRows<3, T>(qr, q_stride, k_rows, tokens, head_dim, sr, s_stride); break;
    case 2: LogitsRows<2, T>(qr, q_stride, k_rows, tokens, head_dim, sr, s_stride); break;
    case 1: LogitsRows<1, T>(qr, q_stride, k_rows, tokens, head_dim, sr, s_stride); break;
    default: break;
  }
}

// acc_r += sum_t p[r][t] * v_t for kRows rows; one V chunk load feeds every
// row, and the accumulators stay in registers across the tile's keys.
template <int kRows, typename T>
HWY_INLINE void PvRows(const float* p, int64_t p_stride, const void* const* v_rows,
                       int64_t tokens, int64_t head_dim, float* acc, int64_t acc_stride) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t d = 0; d < head_dim; d += lanes) {
    const bool full = d + lanes <= head_dim;
    const size_t tail = static_cast<size_t>(head_dim - d);
    VF a0 = hn::LoadU(df, acc + d), a1 = a0, a2 = a0, a3 = a0;
    if constexpr (kRows > 1) a1 = hn::LoadU(df, acc + acc_stride + d);
    if constexpr (kRows > 2) a2 = hn::LoadU(df, acc + 2 * acc_stride + d);
    if constexpr (kRows > 3) a3 = hn::LoadU(df, acc + 3 * acc_stride + d);
    for (int64_t t = 0; t < tokens; ++t) {
      const T* v = static_cast<const T*>(v_rows[t]) + d;
      const VF vv = full ? LoadF32(df, v) : LoadF32Tail(df, v, tail);
      a0 = hn::MulAdd(hn::Set(df, p[t]), vv, a0);
      if constexpr (kRows > 1) a1 = hn::MulAdd(hn::Set(df, p[p_stride + t]), vv, a1);
      if constexpr (kRows > 2) a2 = hn::MulAdd(hn::Set(df, p[2 * p_stride + t]), vv, a2);
      if constexpr (kRows > 3) a3 = hn::MulAdd(hn::Set(df, p[3 * p_stride + t]), vv, a3);
    }
    hn::StoreU(a0, df, acc + d);
    if constexpr (kRows > 1) hn::StoreU(a1, df, acc + acc_stride + d);
    if constexpr (kRows > 2) hn::StoreU(a2, df, acc + 2 * acc_stride + d);
    if constexpr (kRows > 3) hn::StoreU(a3, df, acc + 3 * acc_stride + d);
  }
}

template <typename T>
HWY_NOINLINE void Pv(const float* p, int64_t p_stride, int64_t rows, const void* const* v_rows,
                     int64_t tokens, int64_t head_dim, float* acc, int64_t acc_stride) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    PvRows<4, T>(p + r * p_stride, p_stride, v_rows, tokens, head_dim, acc + r * acc_stride,
                 acc_stride);
  }
  const float* pr = p + r * p_stride;
  float* ar = acc + r * acc_stride;
  switch (rows - r) {
    case 3: PvRows<3, T>(pr, p_stride, v_rows, tokens, head_dim, ar, acc_stride); break;
    case 2: PvRows<2, T>(pr, p_stride, v_rows, tokens, head_dim, ar, acc_stride); break;
    case 1: PvRows<1, T>(pr, p_stride, v_rows, tokens, head_dim, ar, acc_stride); break;
    default: break;
  }
}

// ---- Packed tiles: many rows per kv head (prefill, chunked prefill).
// With R rows sharing a KV tile, converting the tile to f32 once (K
// transposed, V as is) costs about 1/R of the products, and both products
// become register-blocked outer products: kPackedRows rows x 2 vectors of
// keys (or dimensions) per block, one broadcast per row and step, no
// horizontal sums and no conversion inside the loops. Few rows (decode)
// keep the loops above, which convert K/V in registers.
inline constexpr int64_t kPackedMinRows = 32;
inline constexpr int kPackedRows = HWY_MAX_BYTES >= 64 ? 8 : 4;  // 16 or 8 accumulators.
static_assert(2 * HWY_MAX_BYTES / sizeof(float) <= kPackedTokenAlign, "packed K tile padding");

// An L x L transpose (L = Lanes): v[j] lane c becomes v[c] lane j. Within
// each 128-bit block a 4 x 4 transpose (rows interleaved by element, then by
// element pair); with more blocks, the blocks are then transposed too.
HWY_INLINE void TransposeSquare(VF* v) {
#if HWY_TARGET == HWY_SCALAR
  (void)v;  // 1 x 1.
#else
  const DF df;
  const hn::Repartition<uint64_t, DF> d64;
  const size_t lanes = hn::Lanes(df);
  for (size_t i = 0; i < lanes; i += 2) {
    const VF lo = hn::InterleaveLower(df, v[i], v[i + 1]);
    v[i + 1] = hn::InterleaveUpper(df, v[i], v[i + 1]);
    v[i] = lo;
  }
  VF u[HWY_MAX_BYTES / sizeof(float)];
  for (size_t g = 0; g < lanes; g += 4) {  // u[g + k], block L: rows g..g+3 of column 4L + k.
    const auto a = hn::BitCast(d64, v[g]), b = hn::BitCast(d64, v[g + 1]);
    const auto c = hn::BitCast(d64, v[g + 2]), e = hn::BitCast(d64, v[g + 3]);
    u[g] = hn::BitCast(df, hn::InterleaveLower(d64, a, c));
    u[g + 1] = hn::BitCast(df, hn::InterleaveUpper(d64, a, c));
    u[g + 2] = hn::BitCast(df, hn::InterleaveLower(d64, b, e));
    u[g + 3] = hn::BitCast(df, hn::InterleaveUpper(d64, b, e));
  }
  // Column 4L + k takes block L of u[k], u[4 + k], ...: (a0 b0 a2 b2) and
  // (a1 b1 a3 b3) of two vectors, then their 256-bit halves.
  auto even_blocks = [](VF a, VF b) HWY_ATTR {
    return hn::OddEvenBlocks(hn::SwapAdjacentBlocks(b), a);
  };
  auto odd_blocks = [](VF a, VF b) HWY_ATTR {
    return hn::OddEvenBlocks(b, hn::SwapAdjacentBlocks(a));
  };
  for (size_t k = 0; k < 4; ++k) {
    if (lanes == 4) {
      v[k] = u[k];
    } else if (lanes == 8) {
      v[k] = even_blocks(u[k], u[4 + k]);
      v[4 + k] = odd_blocks(u[k], u[4 + k]);
    } else {
      const VF lo1 = even_blocks(u[k], u[4 + k]), hi1 = odd_blocks(u[k], u[4 + k]);
      const VF lo2 = even_blocks(u[8 + k], u[12 + k]), hi2 = odd_blocks(u[8 + k], u[12 + k]);
      v[k] = hn::ConcatLowerLower(df, lo2, lo1);
      v[4 + k] = hn::ConcatLowerLower(df, hi2, hi1);
      v[8 + k] = hn::ConcatUpperUpper(df, lo2, lo1);
      v[12 + k] = hn::ConcatUpperUpper(df, hi2, hi1);
    }
  }
#endif
}

// kt[d * kt_stride + i] = f32 of k_i[d] for i < n, d < head_dim; keys
// [n, RoundUp(n, 2 * Lanes)) are zero. Lanes x Lanes blocks are transposed
// in registers, so every store is a whole vector of kt.
template <typename T>
HWY_NOINLINE void PackKeysTransposed(const void* const* k_rows, int64_t n, int64_t head_dim,
                                     float* kt, int64_t kt_stride) {
  const DF df;
  constexpr int64_t kL = HWY_MAX_BYTES / sizeof(float);
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t n_pad = RoundUp(n, 2 * lanes);
  for (int64_t i0 = 0; i0 < n_pad; i0 += lanes) {
    const int64_t keys = std::clamp<int64_t>(n - i0, 0, lanes);
    for (int64_t d0 = 0; d0 < head_dim; d0 += lanes) {
      const int64_t dims = std::min(lanes, head_dim - d0);
      VF v[kL];
      for (int64_t j = 0; j < lanes; ++j) {
        const T* k = j < keys ? static_cast<const T*>(k_rows[i0 + j]) + d0 : nullptr;
        v[j] = k == nullptr    ? hn::Zero(df)
               : dims == lanes ? LoadF32(df, k)
                               : LoadF32Tail(df, k, static_cast<size_t>(dims));
      }
      TransposeSquare(v);
      for (int64_t c = 0; c < dims; ++c) hn::StoreU(v[c], df, kt + (d0 + c) * kt_stride + i0);
    }
  }
}

// vp[i * dim_pad + d] = f32 of v_i[d], zero for d in [head_dim, dim_pad).
template <typename T>
HWY_NOINLINE void PackValues(const void* const* v_rows, int64_t n, int64_t head_dim,
                             float* vp, int64_t dim_pad) {
  for (int64_t i = 0; i < n; ++i) {
    RowToF32(static_cast<const T*>(v_rows[i]), head_dim, dim_pad, vp + i * dim_pad);
  }
}

// S[r][j] = q_r . k_j for kRows rows and the 2 * Lanes keys [0, keys) of kt.
template <int kRows>
HWY_INLINE void PackedLogitsBlock(const float* q, int64_t q_stride, const float* kt,
                                  int64_t kt_stride, int64_t head_dim, int64_t keys, float* s,
                                  int64_t s_stride) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  VF a0[kRows], a1[kRows];
  for (int r = 0; r < kRows; ++r) a0[r] = a1[r] = hn::Zero(df);
  for (int64_t d = 0; d < head_dim; ++d) {
    const VF k0 = hn::LoadU(df, kt + d * kt_stride);
    const VF k1 = hn::LoadU(df, kt + d * kt_stride + lanes);
    for (int r = 0; r < kRows; ++r) {
      const VF qv = hn::Set(df, q[r * q_stride + d]);
      a0[r] = hn::MulAdd(qv, k0, a0[r]);
      a1[r] = hn::MulAdd(qv, k1, a1[r]);
    }
  }
  HWY_ALIGN float tail[128];  // 2 x the most f32 lanes of any target here.
  for (int r = 0; r < kRows; ++r) {
    float* row = s + r * s_stride;
    if (keys == 2 * lanes) {
      hn::StoreU(a0[r], df, row);
      hn::StoreU(a1[r], df, row + lanes);
    } else {  // Rows are token_pad apart: a full store could reach the next.
      hn::Store(a0[r], df, tail);
      hn::Store(a1[r], df, tail + lanes);
      std::copy(tail, tail + keys, row);
    }
  }
}

// acc_r += sum_i p[r][i] * v_i for kRows rows, v packed by PackValues.
template <int kRows>
HWY_INLINE void PackedPvBlock(const float* p, int64_t p_stride, const float* vp, int64_t n,
                              int64_t dim_pad, float* acc, int64_t acc_stride) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t d = 0; d < dim_pad; d += 2 * lanes) {
    VF a0[kRows], a1[kRows];
    for (int r = 0; r < kRows; ++r) {
      a0[r] = hn::LoadU(df, acc + r * acc_stride + d);
      a1[r] = hn::LoadU(df, acc + r * acc_stride + d + lanes);
    }
    for (int64_t i = 0; i < n; ++i) {
      const VF v0 = hn::LoadU(df, vp + i * dim_pad + d);
      const VF v1 = hn::LoadU(df, vp + i * dim_pad + d + lanes);
      for (int r = 0; r < kRows; ++r) {
        const VF w = hn::Set(df, p[r * p_stride + i]);
        a0[r] = hn::MulAdd(w, v0, a0[r]);
        a1[r] = hn::MulAdd(w, v1, a1[r]);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      hn::StoreU(a0[r], df, acc + r * acc_stride + d);
      hn::StoreU(a1[r], df, acc + r * acc_stride + d + lanes);
    }
  }
}

// Calls block.template operator()<k>(r) for each block of k <= kPackedRows
// rows [r, r + k) of [0, rows).
template <class Block>
HWY_INLINE void ForEachRowBlock(int64_t rows, const Block& block) {
  int64_t r = 0;
  for (; r + kPackedRows <= rows; r += kPackedRows) block.template operator()<kPackedRows>(r);
  switch (rows - r) {
    case 7: if constexpr (kPackedRows > 7) block.template operator()<7>(r); break;
    case 6: if constexpr (kPackedRows > 6) block.template operator()<6>(r); break;
    case 5: if constexpr (kPackedRows > 5) block.template operator()<5>(r); break;
    case 4: if constexpr (kPackedRows > 4) block.template operator()<4>(r); break;
    case 3: block.template operator()<3>(r); break;
    case 2: block.template operator()<2>(r); break;
    case 1: block.template operator()<1>(r); break;
    default: break;
  }
}

HWY_NOINLINE void PackedLogits(const float* q, int64_t q_stride, int64_t rows, const float* kt,
                               int64_t kt_stride, int64_t n, int64_t head_dim, float* s,
                               int64_t s_stride) {
  const int64_t step = 2 * static_cast<int64_t>(hn::Lanes(DF()));
  ForEachRowBlock(rows, [&]<int kRows>(int64_t r) HWY_ATTR {
    for (int64_t j = 0; j < n; j += step) {
      PackedLogitsBlock<kRows>(q + r * q_stride, q_stride, kt + j, kt_stride, head_dim,
                               std::min(step, n - j), s + r * s_stride + j, s_stride);
    }
  });
}

HWY_NOINLINE void PackedPv(const float* p, int64_t p_stride, int64_t rows, const float* vp,
                           int64_t n, int64_t dim_pad, float* acc, int64_t acc_stride) {
  ForEachRowBlock(rows, [&]<int kRows>(int64_t r) HWY_ATTR {
    PackedPvBlock<kRows>(p + r * p_stride, p_stride, vp, n, dim_pad, acc + r * acc_stride,
                         acc_stride);
  });
}

// Rounds to the nearest bf16, ties to even (p in [0, 1]: no overflow): the
// bf16 PV path reads the high halves of these f32s.
HWY_INLINE VF RoundToBf16(DF df, VF x) {
  const hn::RebindToUnsigned<DF> du;
  auto bits = hn::BitCast(du, x);
  const auto odd = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  bits = hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), odd));
  return hn::BitCast(df, hn::And(bits, hn::Set(du, 0xFFFF0000u)));
}

struct SoftmaxParams {
  float logit_scale;  // sm_scale * k_scale.
  float soft_cap;     // 0: none.
  float mask_value;
  bool vanish;        // Masked keys get weight exactly 0.
  int64_t window;     // 0: none.
  bool round_bf16;    // Weights feed the bf16 PV path.
};

// Turns row r's logits S[0, n) of keys [t0, t0 + n) into weights in place
// and updates m, l and the accumulator row. pos: the row's query position;
// kv_len: its sequence's keys.
HWY_INLINE void SoftmaxRow(const SoftmaxParams& sp, int64_t pos, int64_t kv_len, int64_t t0,
                           int64_t n, int64_t n_pad, float* s, float* m, float* l, float* acc,
                           int64_t dim_pad) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const VF neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
  const VF scale = hn::Set(df, sp.logit_scale);
  // Keys t with t > pos (causal) or t <= pos - window are masked.
  const bool any_masked = t0 + n - 1 > pos || (sp.window > 0 && t0 <= pos - sp.window);
  const auto iota = hn::Iota(di, 0);
  VF vmax = neg_inf;
  // Lanes that saw a NaN logit (before the cap: tanh's clamp would hide it).
  VF vnan = hn::Zero(df);
  for (int64_t i = 0; i < n_pad; i += lanes) {
    VF x = hn::Mul(hn::LoadU(df, s + i), scale);
    const auto index = hn::Add(iota, hn::Set(di, static_cast<int32_t>(i)));
    const auto valid = hn::RebindMask(df, hn::Lt(index, hn::Set(di, static_cast<int32_t>(n))));
    vnan = hn::Or(vnan, hn::VecFromMask(df, hn::And(valid, hn::IsNaN(x))));
    if (sp.soft_cap != 0.0f) {
      const VF cap = hn::Set(df, sp.soft_cap);
      x = hn::Mul(cap, hn::Tanh(df, hn::Div(x, cap)));
    }
    if (any_masked) {
      const auto t = hn::Add(index, hn::Set(di, static_cast<int32_t>(t0)));
      auto masked = hn::Gt(t, hn::Set(di, static_cast<int32_t>(pos)));
      if (sp.window > 0) {
        masked = hn::Or(masked,
                        hn::Lt(t, hn::Set(di, static_cast<int32_t>(pos - sp.window + 1))));
      }
      const auto masked_f = hn::RebindMask(df, masked);
      // mask_value -inf is added like the reference does, so a masked +inf
      // logit becomes NaN there too (it poisons the row, as in the
      // reference); other vanishing masks give exactly -inf.
      x = sp.vanish && sp.mask_value != -std::numeric_limits<float>::infinity()
              ? hn::IfThenElse(masked_f, neg_inf, x)
              : hn::IfThenElse(masked_f, hn::Add(x, hn::Set(df, sp.mask_value)), x);
      vnan = hn::Or(vnan, hn::VecFromMask(df, hn::And(valid, hn::IsNaN(x))));
    }
    x = hn::IfThenElse(valid, x, neg_inf);
    hn::StoreU(x, df, s + i);
    vmax = hn::Max(vmax, x);
  }
  const float m_old = *m;
  const float m_new = std::max(m_old, hn::GetLane(hn::MaxOfLanes(df, vmax)));
  if (std::isnan(m_old) || !hn::AllFalse(df, hn::MaskFromVec(vnan)) ||
      m_new == std::numeric_limits<float>::infinity()) {
    // A NaN logit, or a +inf one (exp(inf - inf)), makes the row NaN in the
    // reference (SPEC §1: NaN in valid data propagates): poison the state;
    // m stays NaN, so later tiles come here too, and the output is NaN.
    for (int64_t i = 0; i < n_pad; ++i) s[i] = 0.0f;
    *m = std::numeric_limits<float>::quiet_NaN();
    *l = std::numeric_limits<float>::quiet_NaN();
    for (int64_t d = 0; d < dim_pad; ++d) acc[d] = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  if (m_new == -std::numeric_limits<float>::infinity()) {
    // No key of this row visible yet, or only keys whose logit is -inf:
    // weights 0, state unchanged. If the reference's maximum over the row
    // is then -inf too, its output is exp(-inf - -inf) = NaN, unless a later
    // key is finite: l = -0 marks that (checked at the end). That is so when
    // every key takes part (an additive mask_value: masked keys are logit +
    // mask_value, -inf here too) or, with masked keys vanishing, when a
    // visible key was in the tile and either mask_value is -inf or the row
    // masks no key at all. (Otherwise a finite mask_value <= -1e4 makes the
    // reference weigh the masked keys instead; those may be skipped, SPEC §1.)
    const int64_t first = sp.window > 0 ? std::max(t0, pos - sp.window + 1) : t0;
    const bool visible = std::min(t0 + n - 1, pos) >= first;
    const bool masks_none = pos == kv_len - 1 && (sp.window == 0 || sp.window > pos);
    if ((!sp.vanish && n > 0) ||
        (visible && (masks_none || sp.mask_value == -std::numeric_limits<float>::infinity()))) {
      *l = -0.0f;
    }
    for (int64_t i = 0; i < n_pad; ++i) s[i] = 0.0f;
    return;
  }
  const VF vm = hn::Set(df, m_new);
  VF vsum = hn::Zero(df);
  for (int64_t i = 0; i < n_pad; i += lanes) {
    const VF x = hn::LoadU(df, s + i);
    const VF p = hn::Exp(df, hn::Sub(x, vm));  // exp(-inf) = 0 for masked keys.
    // l sums the exact weights, so the LSE stays f32-accurate; PV on the
    // bf16 path multiplies them rounded (relative error <= 2^-9 each).
    vsum = hn::Add(vsum, p);
    hn::StoreU(sp.round_bf16 ? RoundToBf16(df, p) : p, df, s + i);
  }
  const float alpha = m_old == -std::numeric_limits<float>::infinity() ? 0.0f
                                                                      : std::exp(m_old - m_new);
  *m = m_new;
  *l = *l * alpha + hn::GetLane(hn::SumOfLanes(df, vsum));
  if (alpha != 1.0f) {
    const VF va = hn::Set(df, alpha);
    for (int64_t d = 0; d < dim_pad; d += lanes) {
      hn::StoreU(hn::Mul(hn::LoadU(df, acc + d), va), df, acc + d);
    }
  }
}

// Recomputes in f32 the bf16-path logits that came out NaN (see RunTask).
inline void FixNanLogits(const float* q, int64_t q_stride, int64_t rows,
                         const void* const* k_rows, int64_t tokens, int64_t head_dim, float* s,
                         int64_t s_stride) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  VF bad = hn::Zero(df);
  bool tail_bad = false;
  for (int64_t r = 0; r < rows; ++r) {
    const float* sr = s + r * s_stride;
    int64_t i = 0;
    for (; i + lanes <= tokens; i += lanes) {
      const VF x = hn::LoadU(df, sr + i);
      bad = hn::Or(bad, hn::VecFromMask(df, hn::IsNaN(x)));
    }
    for (; i < tokens; ++i) tail_bad |= std::isnan(sr[i]);
  }
  if (!tail_bad && hn::AllFalse(df, hn::MaskFromVec(bad))) return;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < tokens; ++i) {
      float& x = s[r * s_stride + i];
      if (!std::isnan(x)) continue;
      const BF16* k = static_cast<const BF16*>(k_rows[i]);
      float dot = 0.0f;
      for (int64_t d = 0; d < head_dim; ++d) dot += q[r * q_stride + d] * F32FromBF16(k[d]);
      x = dot;
    }
  }
}

// Calls fn(T{}) with T the storage tag of K/V dtype kv (see LoadF32).
template <class Fn>
HWY_INLINE void VisitKvElem(DType kv, const Fn& fn) {
  switch (kv) {
    case DType::kF8E4M3FN: return fn(E4M3Elem{});
    case DType::kF8E5M2: return fn(E5M2Elem{});
    case DType::kI8: return fn(I8Elem{});
    case DType::kBF16: return fn(hwy::bfloat16_t{});
    case DType::kF16: return fn(hwy::float16_t{});
    default: return fn(float{});
  }
}

// A row of `dtype` (f32, bf16 or f16 q; any K/V dtype) as f32 (RowToF32).
inline void LoadRowF32(DType dtype, const void* row, int64_t count, int64_t count_pad,
                       float* dst) {
  VisitKvElem(dtype, [&](auto tag) HWY_ATTR {
    RowToF32(static_cast<const decltype(tag)*>(row), count, count_pad, dst);
  });
}

inline const uint8_t* ElementPtr(const void* base, DType dtype, int64_t offset) {
  return static_cast<const uint8_t*>(base) + offset * static_cast<int64_t>(SizeOf(dtype));
}

// Writes f32 values as `count` elements of `dtype` at dst.
inline void StoreRow(DType dtype, void* dst, const float* src, int64_t count) {
  switch (dtype) {
    case DType::kF32: std::memcpy(dst, src, sizeof(float) * count); return;
    case DType::kBF16: {
      BF16* out = static_cast<BF16*>(dst);
      for (int64_t d = 0; d < count; ++d) out[d] = BF16FromF32(src[d]);
      return;
    }
    default:
      for (int64_t d = 0; d < count; ++d) StoreFromF32(dtype, dst, d, src[d]);
      return;
  }
}

// Fills base[i] with kv head task.kv_head's K (or V) row of key t0 + i,
// walking the page table page by page (one division per tile, not per key).
inline void TileRowPointers(const AttentionProblem& pr, const PagesView& pages, int32_t seq,
                            int32_t kv_head, int64_t t0, int64_t n, const uint8_t** base) {
  const int64_t elem = static_cast<int64_t>(SizeOf(pr.kv_dtype));
  int64_t column = t0 / pr.page_size;
  int64_t slot = t0 % pr.page_size;
  for (int64_t i = 0; i < n;) {
    const uint8_t* row = ElementPtr(pages.data, pr.kv_dtype,
                                    pages.Offset(pr.PageIndex(seq, column), slot, kv_head));
    const int64_t count = std::min(n - i, pr.page_size - slot);
    for (int64_t j = 0; j < count; ++j) base[i + j] = row + j * pages.slot_stride * elem;
    i += count;
    slot = 0;
    ++column;
  }
}

// Keys per tile when a task spans several kv heads (32 tokens x 4 KiB for 8
// kv heads x 128 bf16 x K,V = 128 KiB per tile). Measured on the decode
// shape (docs/kernel.md): 24-32 keys 9.4 ms, 48 9.7, 64 13.6, 128 22 (no
// prefetch): the next tile, prefetched meanwhile, and the current one stay
// in L2 and the misses in flight stay few enough not to stall the products.
inline constexpr int64_t kMultiHeadTile = 32;

HWY_NOINLINE void RunTask(const AttentionProblem& pr, const KernelTask& task, int64_t kv_block,
                          KernelPath path, const WorkerScratch& ws, float* partials) {
  const int64_t G = pr.QueriesPerKvHead();
  const int64_t D = pr.head_dim;
  const int64_t dim_pad = ws.dim_pad;
  const int64_t heads = task.kv_head_end - task.kv_head;
  const int64_t rows_per_head = (task.q_end - task.q_begin) * G;
  const int64_t rows = rows_per_head * heads;
  const int64_t q_start = pr.cu_q_lens[task.seq];
  const int64_t q_len = pr.cu_q_lens[task.seq + 1] - q_start;
  const int64_t kv_len = pr.kv_lens[task.seq];
  const bool fp8 = pr.kv_dtype == DType::kF8E4M3FN || pr.kv_dtype == DType::kF8E5M2;
  const bool bf16_kv = pr.kv_dtype == DType::kBF16 || fp8;
  const bool packed = rows_per_head >= kPackedMinRows;
  const bool bf16_path = !packed && path == KernelPath::kAvx512Bf16 && bf16_kv;
  const bool wide_path = !packed && path == KernelPath::kAvx512Wide && bf16_kv;
  // Widening path, fp8 K/V: with few rows per kv head (decode) each K/V
  // chunk is converted once, in the product loops' registers; with more,
  // every 4-row block would convert it again, so a tile is converted once
  // into bf16 scratch rows (Fp8RowsToBf16) and the bf16 loops run.
  const bool fp8_in_loops = fp8 && rows_per_head <= 8;
  const DType wide_dtype = fp8_in_loops ? pr.kv_dtype : DType::kBF16;
  // e4m3fn converts to value * 2^-8 (LoadF32): undone in the scales.
  const float e4m3 = pr.kv_dtype == DType::kF8E4M3FN ? kE4M3Rescale : 1.0f;
  // Row r's token and q head (see KernelTask).
  auto token_of = [&](int64_t r) { return q_start + task.q_begin + (r % rows_per_head) / G; };
  auto head_of = [&](int64_t r) { return (task.kv_head + r / rows_per_head) * G + r % G; };

  // Decode's fused tiles: up to 8 rows per kv head (fp8 is converted in the
  // loops up to 8), no soft cap; a tile qualifies when all its keys are
  // visible to every row. Rows go in groups of 4 and a last smaller group.
  // 8-bit floats run in f16 arithmetic where the CPU has it (HalfDecodeTile,
  // WideDecodeTile where it declines), cheaper than the unfused path for any
  // group; else WideDecodeTile, whose 4 rows' work a last 1 or 2 rows would
  // not pay for: they take the unfused path.
  const bool fusable = wide_path && rows_per_head <= 8 && pr.soft_cap == 0.0f;
  const bool half_decode = fusable && fp8 && HalfDecodeEnabled();
  const int64_t min_group = half_decode ? 1 : 3;
  const bool fused_decode = fusable && rows_per_head >= min_group;
  const int64_t half_stride = RoundUp(dim_pad, kHalfDimAlign);

  for (int64_t r = 0; r < rows; ++r) {
    const int64_t offset = token_of(r) * pr.q_token_stride + head_of(r) * pr.q_head_stride;
    float* q = ws.q + r * dim_pad;
    LoadRowF32(pr.q_dtype, ElementPtr(pr.q, pr.q_dtype, offset), D, dim_pad, q);
    if (bf16_path) {
      for (int64_t d = 0; d < dim_pad; ++d) {
        const BF16 hi = BF16FromF32(q[d]);
        ws.q_hi[r * dim_pad + d] = hi.bits;
        // inf - inf would make lo NaN: an infinite (or NaN) q is all in hi.
        ws.q_lo[r * dim_pad + d] =
            std::isfinite(q[d]) ? BF16FromF32(q[d] - F32FromBF16(hi)).bits : uint16_t{0};
      }
    }
    if (wide_path) {
      float* q_eo = ws.q_eo + r * dim_pad;
      for (int64_t d = 0; d < dim_pad; ++d) q_eo[WideQIndex(d)] = q[d];
    }
    if (half_decode) {
      ws.q_half_unscale[r] = QRowToHalf(pr.kv_dtype, q, D, ws.q_half + r * half_stride);
    }
    ws.m[r] = -std::numeric_limits<float>::infinity();
    ws.l[r] = 0.0f;
    std::memset(ws.acc + r * dim_pad, 0, sizeof(float) * dim_pad);
  }
  const uint16_t* q_lo = pr.q_dtype == DType::kBF16 ? nullptr : ws.q_lo;  // Else exactly 0.

  SoftmaxParams sp;
  sp.logit_scale = pr.sm_scale * pr.k_scale * e4m3;
  sp.soft_cap = pr.soft_cap;
  sp.mask_value = pr.mask_value;
  sp.vanish = pr.MaskedKeysVanish();
  sp.window = pr.sliding_window;
  sp.round_bf16 = bf16_path;

  const int64_t first_pos = kv_len - q_len + task.q_begin;
  const int64_t last_pos = kv_len - q_len + task.q_end - 1;
  auto all_visible = [&](int64_t begin, int64_t end) {
    return end - 1 <= first_pos && (pr.sliding_window == 0 || begin > last_pos - pr.sliding_window);
  };

  const int64_t s_stride = ws.token_pad;
  const int64_t elem = static_cast<int64_t>(SizeOf(pr.kv_dtype));
  const int64_t row_bytes = D * elem;
  const int64_t k_head_bytes = pr.k.head_stride * elem;
  const int64_t v_head_bytes = pr.v.head_stride * elem;
  const int64_t step = heads > 1 ? std::min(kv_block, kMultiHeadTile) : kv_block;
  // Tile [t0, t1): within one kv_block tile (chunks split there) and `step`.
  auto tile_end = [&](int64_t t0) {
    return std::min({static_cast<int64_t>(task.kv_end), (t0 / kv_block + 1) * kv_block,
                     t0 + step});
  };
  // Row pointers of the current and the next tile (ping-pong). Only keys
  // below kv_len are ever read, so NaN pages and garbage page indices past
  // them are never followed. One kv head's rows sit a whole token apart (4
  // KiB for 8 kv heads x 128 bf16 x K,V), which the hardware prefetchers do
  // not follow: the next tile's rows are prefetched into L2 while this one
  // is computed, and the first tile's up front.
  int cur = 0;
  int64_t t0 = task.kv_begin;
  int64_t t1 = t0 < task.kv_end ? tile_end(t0) : t0;
  if (t0 < t1) {
    TileRowPointers(pr, pr.k, task.seq, task.kv_head, t0, t1 - t0, ws.k_base);
    TileRowPointers(pr, pr.v, task.seq, task.kv_head, t0, t1 - t0, ws.v_base);
    for (int64_t i = 0; i < t1 - t0; ++i) {
      for (int64_t h = 0; h < heads; ++h) {
        PrefetchRow(ws.k_base[i] + h * k_head_bytes, row_bytes);
        PrefetchRow(ws.v_base[i] + h * v_head_bytes, row_bytes);
      }
    }
  }
  while (t0 < t1) {
    const int64_t n = t1 - t0;
    const int64_t t2 = t1 < task.kv_end ? tile_end(t1) : t1;
    const int64_t n_next = t2 - t1;
    const uint8_t** k_cur = ws.k_base + cur * ws.token_pad;
    const uint8_t** v_cur = ws.v_base + cur * ws.token_pad;
    const uint8_t** k_nb = ws.k_base + (1 - cur) * ws.token_pad;
    const uint8_t** v_nb = ws.v_base + (1 - cur) * ws.token_pad;
    if (n_next > 0) {
      TileRowPointers(pr, pr.k, task.seq, task.kv_head, t1, n_next, k_nb);
      TileRowPointers(pr, pr.v, task.seq, task.kv_head, t1, n_next, v_nb);
    }
    const int64_t n_pad = RoundUp(n, static_cast<int64_t>(hn::Lanes(DF())));
    const int64_t kt_stride = RoundUp(n, 2 * static_cast<int64_t>(hn::Lanes(DF())));
    const bool fused = fused_decode && n <= kWideDecodeMaxKeys && all_visible(t0, t1);
    for (int64_t h = 0; h < heads; ++h) {
      // Rows [h * rows_per_head, r0) done by fused tiles, [r0, r0 + rows_left) not.
      int64_t r0 = h * rows_per_head;
      int64_t rows_left = rows_per_head;
      while (fused && rows_left >= min_group) {
        const int64_t group = std::min<int64_t>(rows_left, 4);
        const bool first = rows_left == rows_per_head;  // It prefetches the next tile.
        const uint8_t* const* k_pf = first ? k_nb : nullptr;
        const bool done =
            (half_decode &&
             HalfDecodeTile(pr.kv_dtype, ws.q_half + r0 * half_stride, half_stride,
                            ws.q_half_unscale + r0, group, k_cur, v_cur, h * k_head_bytes,
                            h * v_head_bytes, n, D, sp.logit_scale, ws.m + r0, ws.l + r0,
                            ws.acc + r0 * dim_pad, dim_pad, k_pf, v_nb, n_next, row_bytes)) ||
            WideDecodeTile(wide_dtype, ws.q_eo + r0 * dim_pad, dim_pad, group, k_cur, v_cur,
                           h * k_head_bytes, h * v_head_bytes, n, D, sp.logit_scale, ws.m + r0,
                           ws.l + r0, ws.acc + r0 * dim_pad, dim_pad, k_pf, v_nb, n_next,
                           row_bytes);
        if (!done) break;
        r0 += group;
        rows_left -= group;
      }
      if (rows_left == 0) continue;
      const int64_t next_count = rows_left == rows_per_head ? n_next : 0;
      float* s_h = ws.s + r0 * s_stride;
      float* acc_h = ws.acc + r0 * dim_pad;
      for (int64_t i = 0; i < n; ++i) {
        ws.k_rows[i] = k_cur[i] + h * k_head_bytes;
        ws.v_rows[i] = v_cur[i] + h * v_head_bytes;
      }
      for (int64_t i = 0; i < next_count; ++i) {
        ws.k_next[i] = k_nb[i] + h * k_head_bytes;
        ws.v_next[i] = v_nb[i] + h * v_head_bytes;
      }
      if (wide_path) {
        if (fp8 && !fp8_in_loops) Fp8RowsToBf16(pr.kv_dtype, ws.k_rows, n, D, ws.kv_bf16, dim_pad);
        WideLogits(wide_dtype, ws.q_eo + r0 * dim_pad, dim_pad, rows_left, ws.k_rows, n, D,
                   s_h, s_stride, ws.k_next, next_count, row_bytes);
      } else if (bf16_path) {
        if (fp8) Fp8RowsToBf16(pr.kv_dtype, ws.k_rows, n, D, ws.kv_bf16, dim_pad);
        Bf16Logits(ws.q_hi + r0 * dim_pad, q_lo != nullptr ? q_lo + r0 * dim_pad : nullptr,
                   dim_pad, rows_left, ws.k_rows, n, D, s_h, s_stride, ws.k_next, next_count);
        // hi + lo: an infinite K element makes 0 * inf = NaN in the lo term
        // (or inf - inf across the two) where q . k is a signed infinity.
        // Rare, so such logits are recomputed in f32 from the f32 q.
        if (q_lo != nullptr) {
          FixNanLogits(ws.q + r0 * dim_pad, dim_pad, rows_left, ws.k_rows, n, D, s_h,
                       s_stride);
        }
      } else {
        for (int64_t i = 0; i < next_count; ++i) PrefetchRow(ws.k_next[i], row_bytes);
        VisitKvElem(pr.kv_dtype, [&](auto tag) HWY_ATTR {
          using T = decltype(tag);
          if (packed) {
            PackKeysTransposed<T>(ws.k_rows, n, D, ws.packed, kt_stride);
            PackedLogits(ws.q + r0 * dim_pad, dim_pad, rows_left, ws.packed, kt_stride, n,
                         D, s_h, s_stride);
          } else {
            Logits<T>(ws.q + r0 * dim_pad, dim_pad, rows_left, ws.k_rows, n, D, s_h,
                      s_stride);
          }
        });
      }
      for (int64_t r = r0; r < r0 + rows_left; ++r) {
        const int64_t pos = kv_len - q_len + task.q_begin + (r % rows_per_head) / G;
        SoftmaxRow(sp, pos, kv_len, t0, n, n_pad, ws.s + r * s_stride, ws.m + r, ws.l + r,
                   ws.acc + r * dim_pad, dim_pad);
      }
      if (wide_path) {
        if (fp8 && !fp8_in_loops) Fp8RowsToBf16(pr.kv_dtype, ws.v_rows, n, D, ws.kv_bf16, dim_pad);
        WidePv(wide_dtype, s_h, s_stride, rows_left, ws.v_rows, n, D, acc_h, dim_pad,
               ws.v_next, next_count, row_bytes);
      } else if (bf16_path) {
        if (fp8) Fp8RowsToBf16(pr.kv_dtype, ws.v_rows, n, D, ws.kv_bf16, dim_pad);
        Bf16AccumulatePV(s_h, s_stride, rows_left, ws.v_rows, n, D, acc_h, dim_pad,
                         ws.v_next, next_count);
      } else {
        for (int64_t i = 0; i < next_count; ++i) PrefetchRow(ws.v_next[i], row_bytes);
        VisitKvElem(pr.kv_dtype, [&](auto tag) HWY_ATTR {
          using T = decltype(tag);
          if (packed) {
            PackValues<T>(ws.v_rows, n, D, ws.packed, dim_pad);
            PackedPv(s_h, s_stride, rows_left, ws.packed, n, dim_pad, acc_h, dim_pad);
          } else {
            Pv<T>(s_h, s_stride, rows_left, ws.v_rows, n, D, acc_h, dim_pad);
          }
        });
      }
    }
    cur = 1 - cur;
    t0 = t1;
    t1 = t2;
  }

  // Back to natural dimension order (the bf16 and widening PV paths
  // interleave it).
  if (bf16_path || wide_path) {
    for (int64_t r = 0; r < rows; ++r) {
      float* acc = ws.acc + r * dim_pad;
      for (int64_t c = 0; c < dim_pad; c += 32) {
        float chunk[32];
        std::memcpy(chunk, acc + c, sizeof(chunk));
        for (int64_t i = 0; i < 32; ++i) {
          acc[c + i] = chunk[bf16_path ? Bf16AccIndex(i) : WideQIndex(i)];
        }
      }
    }
  }

  if (task.partial_offset >= 0) {
    float* out = partials + task.partial_offset;
    std::memcpy(out, ws.m, sizeof(float) * rows);
    std::memcpy(out + rows, ws.l, sizeof(float) * rows);
    std::memcpy(out + 2 * rows, ws.acc, sizeof(float) * rows * dim_pad);
    return;
  }
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r = 0; r < rows; ++r) {
    const float l = ws.l[r];
    const int64_t token = token_of(r);
    const int64_t head = head_of(r);
    // A sink joins the denominator only (SPEC §1), in the frame of m.
    // l == 0: no key visible; a NaN l (poisoned row) gives NaN, and so
    // does l == -0 (only -inf logits under mask_value -inf, SoftmaxRow).
    // (A finite sink bounds the reference's shift instead: output 0.)
    const bool nan_row = l == 0.0f && std::signbit(l) &&
                         (pr.sinks == nullptr ||
                          pr.sinks[head] == -std::numeric_limits<float>::infinity());
    const float denominator =
        pr.sinks != nullptr && l != 0.0f ? l + std::exp(pr.sinks[head] - ws.m[r]) : l;
    const float out_scale = nan_row   ? std::numeric_limits<float>::quiet_NaN()
                            : l != 0.0f ? pr.v_scale * e4m3 / denominator
                                        : 0.0f;
    if (pr.lse != nullptr) {
      pr.lse[token * pr.lse_token_stride + head] =
          nan_row     ? std::numeric_limits<float>::quiet_NaN()
          : l != 0.0f ? ws.m[r] + std::log(l)
                      : -std::numeric_limits<float>::infinity();
    }
    float* acc = ws.acc + r * dim_pad;
    for (int64_t d = 0; d < dim_pad; d += lanes) {
      hn::StoreU(hn::Mul(hn::LoadU(df, acc + d), hn::Set(df, out_scale)), df, acc + d);
    }
    void* dst = static_cast<uint8_t*>(pr.out) +
                (token * pr.out_token_stride + head * pr.out_head_stride) *
                    static_cast<int64_t>(SizeOf(pr.q_dtype));
    StoreRow(pr.q_dtype, dst, acc, D);
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace rpa::internal
HWY_AFTER_NAMESPACE();

#endif  // RPA_SRC_KERNEL_ATTENTION_INL_H_
