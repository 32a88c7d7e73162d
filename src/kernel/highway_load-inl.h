// K/V and q rows converted to f32 in registers, for every Highway target:
// the portable conversions every Highway tile kernel uses.
// Compiled once per Highway target: include it only through
// hwy/foreach_target.h (highway_kernel.cc).
#if defined(RPA_SRC_KERNEL_HIGHWAY_LOAD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RPA_SRC_KERNEL_HIGHWAY_LOAD_INL_H_
#undef RPA_SRC_KERNEL_HIGHWAY_LOAD_INL_H_
#else
#define RPA_SRC_KERNEL_HIGHWAY_LOAD_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "hwy/highway.h"
#include "kernel/tile_kernel.h"
#include "rpa/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace rpa::internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// f32 vectors of at most 16 lanes (512 bits, AVX-512's width): the scratch
// is padded for that (kDimAlign, kPackedTokenAlign), so an SVE CPU with
// longer vectors computes on their first 512 bits.
using DF = hn::CappedTag<float, 16>;
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

// f16 lanes to f32. Where Highway emulates the conversion (x86 without
// F16C, EMU128, SCALAR) it maps the all-ones exponent to a finite value
// (2^16 and up); there inf and NaN are rebuilt: sign, exponent 0xFF, the
// mantissa shifted up (zero: inf; any other: NaN).
HWY_INLINE VF PromoteF16(DF df, hn::Vec<hn::Rebind<hwy::float16_t, DF>> h) {
  const VF f = hn::PromoteTo(df, h);
#if HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3 || HWY_TARGET == HWY_EMU128 || \
    HWY_TARGET == HWY_SCALAR
  const hn::RebindToUnsigned<DF> du;
  const auto bits = hn::PromoteTo(du, hn::BitCast(hn::Rebind<uint16_t, DF>(), h));
  const auto exponent = hn::Set(du, uint32_t{0x7C00});
  const auto special = hn::Eq(hn::And(bits, exponent), exponent);
  const auto sign = hn::ShiftLeft<16>(hn::And(bits, hn::Set(du, uint32_t{0x8000})));
  const auto mantissa = hn::ShiftLeft<13>(hn::And(bits, hn::Set(du, uint32_t{0x3FF})));
  const auto rebuilt = hn::Or(hn::Or(sign, hn::Set(du, uint32_t{0x7F800000})), mantissa);
  return hn::IfThenElse(hn::RebindMask(df, special), hn::BitCast(df, rebuilt), f);
#else
  return f;
#endif
}

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
      return PromoteF16(df, hn::BitCast(dh, hn::ShiftLeft<8>(x)));
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
  } else if constexpr (std::is_same_v<T, hwy::float16_t>) {
    return PromoteF16(df, hn::LoadU(hn::Rebind<T, DF>(), p));
  } else {
    const hn::Rebind<T, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, p));
  }
}

// The first `count` (< Lanes) elements, zeros after; reads nothing beyond.
template <typename T>
HWY_INLINE VF LoadF32Tail(DF df, const T* p, size_t count) {
  // DF's most lanes on every target (a buffer of the target's own lanes
  // would draw a false overflow warning on the 1-lane ones).
  T buf[16];
  static_assert(hn::MaxLanes(DF()) <= 16);
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

// fn(T{}) with T the storage tag of K/V dtype kv (see LoadF32).
template <class Fn>
HWY_INLINE decltype(auto) VisitKvElem(DType kv, const Fn& fn) {
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

// Calls block.template operator()<k>(r) for each block of k <= kMax rows
// [r, r + k) of [0, rows): kMax-row blocks, then one block of the rest.
template <int kMax, class Block>
HWY_INLINE void ForEachRowBlock(int64_t rows, const Block& block) {
  static_assert(kMax >= 1 && kMax <= 8);
  int64_t r = 0;
  for (; r + kMax <= rows; r += kMax) block.template operator()<kMax>(r);
  switch (rows - r) {
    case 7: if constexpr (kMax > 7) block.template operator()<7>(r); break;
    case 6: if constexpr (kMax > 6) block.template operator()<6>(r); break;
    case 5: if constexpr (kMax > 5) block.template operator()<5>(r); break;
    case 4: if constexpr (kMax > 4) block.template operator()<4>(r); break;
    case 3: if constexpr (kMax > 3) block.template operator()<3>(r); break;
    case 2: if constexpr (kMax > 2) block.template operator()<2>(r); break;
    case 1: if constexpr (kMax > 1) block.template operator()<1>(r); break;
    default: break;
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace rpa::internal
HWY_AFTER_NAMESPACE();

#endif  // RPA_SRC_KERNEL_HIGHWAY_LOAD_INL_H_
