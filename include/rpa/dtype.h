// Element types rpa reads and writes, and the one exact conversion for each.
//
// Every conversion rounds to nearest, ties to even, and is written once here:
// the reference, the kernels, the KV-cache writer and the tests all use it.
#ifndef RPA_DTYPE_H_
#define RPA_DTYPE_H_

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace rpa {

// The names are NumPy's / ml_dtypes', so error messages read like JAX's.
// F64, I64 and U8 are never computed on; they exist so that a caller who
// passes them gets a message that names them.
enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kF8E4M3FN,  // 4 exponent bits, bias 7, no infinity, max 448.
  kF8E5M2,    // 5 exponent bits, bias 15, IEEE-like, max 57344.
  kI8,
  kI32,
  kI64,
  kF64,
  kU8,
};

constexpr std::string_view ToString(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kF8E4M3FN: return "float8_e4m3fn";
    case DType::kF8E5M2: return "float8_e5m2";
    case DType::kI8: return "int8";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kF64: return "float64";
    case DType::kU8: return "uint8";
  }
  return "unknown";
}

// Accepts ToString's names and the short ones: f32, bf16, f16, fp8_e4m3,
// fp8_e5m2, i8.
constexpr std::optional<DType> DTypeFromString(std::string_view name) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3FN, DType::kF8E5M2,
                  DType::kI8, DType::kI32, DType::kI64, DType::kF64, DType::kU8}) {
    if (name == ToString(d)) return d;
  }
  if (name == "f32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  if (name == "f16") return DType::kF16;
  if (name == "fp8_e4m3" || name == "e4m3") return DType::kF8E4M3FN;
  if (name == "fp8_e5m2" || name == "e5m2") return DType::kF8E5M2;
  if (name == "i8") return DType::kI8;
  return std::nullopt;
}

constexpr size_t SizeOf(DType dtype) {
  switch (dtype) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kBF16: case DType::kF16: return 2;
    case DType::kF8E4M3FN: case DType::kF8E5M2: case DType::kI8:
    case DType::kU8: return 1;
    case DType::kI64: case DType::kF64: return 8;
  }
  return 0;
}

// Storage types: distinct so that overloads cannot mix up a bf16 and an f16.
struct BF16 { uint16_t bits; };
struct F16 { uint16_t bits; };
struct F8E4M3FN { uint8_t bits; };
struct F8E5M2 { uint8_t bits; };

// ---- bfloat16: the upper half of an f32.
constexpr float F32FromBF16(BF16 x) {
  return std::bit_cast<float>(static_cast<uint32_t>(x.bits) << 16);
}
constexpr BF16 BF16FromF32(float f) {
  uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: keep sign, force quiet.
    return BF16{static_cast<uint16_t>((bits >> 16) | 0x0040u)};
  }
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // Ties to even; overflow gives inf.
  return BF16{static_cast<uint16_t>(bits >> 16)};
}

namespace detail {

// A small IEEE-style float: kExpBits exponent bits with the given bias,
// kManBits mantissa bits. kHasInf: the all-ones exponent holds inf/NaN
// (IEEE, e5m2, f16); otherwise only all-ones exponent and mantissa is NaN
// (the "fn" types: e4m3fn).
template <int kExpBits, int kManBits, int kBias, bool kHasInf>
struct MiniFloat {
  static constexpr uint32_t kExpMask = (1u << kExpBits) - 1;
  static constexpr uint32_t kManMask = (1u << kManBits) - 1;
  static constexpr uint32_t kSignBit = 1u << (kExpBits + kManBits);
  // Largest finite code (magnitude bits only).
  static constexpr uint32_t kMaxFinite =
      kHasInf ? ((kExpMask - 1) << kManBits) | kManMask
              : (kExpMask << kManBits) | (kManMask - 1);
  static constexpr uint32_t kInf = kExpMask << kManBits;
  static constexpr uint32_t kNaN = kHasInf ? (kExpMask << kManBits) | (1u << (kManBits - 1))
                                           : (kExpMask << kManBits) | kManMask;

  static float Decode(uint32_t code) {
    const bool negative = (code & kSignBit) != 0;
    const uint32_t exp = (code >> kManBits) & kExpMask;
    const uint32_t man = code & kManMask;
    float magnitude;
    if (kHasInf && exp == kExpMask) {
      magnitude = man == 0 ? INFINITY : NAN;
    } else if (!kHasInf && exp == kExpMask && man == kManMask) {
      magnitude = NAN;
    } else if (exp == 0) {
      magnitude = std::ldexp(static_cast<float>(man), 1 - kBias - kManBits);
    } else {
      magnitude = std::ldexp(static_cast<float>(man | (kManMask + 1)),
                             static_cast<int>(exp) - kBias - kManBits);
    }
    return negative ? -magnitude : magnitude;
  }

  // kSaturate: finite values beyond the largest finite (and, for types
  // without inf, infinities) become the largest finite of their sign.
  template <bool kSaturate>
  static uint32_t Encode(float f) {
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    const uint32_t sign = (bits >> 31) ? kSignBit : 0;
    const uint32_t abs_bits = bits & 0x7FFFFFFFu;
    if (abs_bits > 0x7F800000u) return sign | kNaN;
    const uint32_t overflow = (kSaturate || !kHasInf) ? kMaxFinite : kInf;
    if (abs_bits == 0x7F800000u) return sign | (kHasInf ? kInf : overflow);
    const int exp = static_cast<int>(abs_bits >> 23) - 127;
    uint32_t code;
    if (exp < 1 - kBias) {
      // Subnormal in the target: count quanta of 2^(1-bias-man) with the
      // FPU's ties-to-even; a carry into 2^man is exactly the smallest
      // normal's code.
      const float quanta = std::ldexp(std::fabs(f), kBias - 1 + kManBits);
      code = static_cast<uint32_t>(std::nearbyint(quanta));
    } else {
      constexpr int kShift = 23 - kManBits;
      const uint32_t rounded =
          abs_bits + ((1u << (kShift - 1)) - 1) + ((abs_bits >> kShift) & 1u);
      code = (rounded >> kShift) - (static_cast<uint32_t>(127 - kBias) << kManBits);
    }
    if (code > kMaxFinite) code = overflow;
    return sign | code;
  }
};

using F16Format = MiniFloat<5, 10, 15, true>;
using E4M3FNFormat = MiniFloat<4, 3, 7, false>;
using E5M2Format = MiniFloat<5, 2, 15, true>;

}  // namespace detail

// ---- float16 (IEEE binary16): overflow rounds to inf, as IEEE does.
inline float F32FromF16(F16 x) { return detail::F16Format::Decode(x.bits); }
inline F16 F16FromF32(float f) {
  return F16{static_cast<uint16_t>(detail::F16Format::Encode<false>(f))};
}

// ---- fp8. Conversion from f32 saturates: a KV-cache writer quantizing
// x / scale must never turn an outlier into NaN (e4m3fn has no inf) or inf,
// which would poison every softmax row that reads it. NaN stays NaN; for
// e5m2 an input inf stays inf.
inline float F32FromF8E4M3FN(F8E4M3FN x) { return detail::E4M3FNFormat::Decode(x.bits); }
inline F8E4M3FN F8E4M3FNFromF32(float f) {
  return F8E4M3FN{static_cast<uint8_t>(detail::E4M3FNFormat::Encode<true>(f))};
}
inline float F32FromF8E5M2(F8E5M2 x) { return detail::E5M2Format::Decode(x.bits); }
inline F8E5M2 F8E5M2FromF32(float f) {
  return F8E5M2{static_cast<uint8_t>(detail::E5M2Format::Encode<true>(f))};
}

// ---- int8: round to nearest even, saturate to [-128, 127]; NaN becomes 0.
inline int8_t I8FromF32(float f) {
  if (std::isnan(f)) return 0;
  const float r = std::nearbyint(f);
  if (r <= -128.0f) return -128;
  if (r >= 127.0f) return 127;
  return static_cast<int8_t>(r);
}

// Reads element `index` of a buffer of `dtype` as f32. For the reference and
// the slow paths; kernels convert whole vectors in registers instead.
inline float LoadAsF32(DType dtype, const void* data, int64_t index) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[index];
    case DType::kBF16: return F32FromBF16(static_cast<const BF16*>(data)[index]);
    case DType::kF16: return F32FromF16(static_cast<const F16*>(data)[index]);
    case DType::kF8E4M3FN: return F32FromF8E4M3FN(static_cast<const F8E4M3FN*>(data)[index]);
    case DType::kF8E5M2: return F32FromF8E5M2(static_cast<const F8E5M2*>(data)[index]);
    case DType::kI8: return static_cast<const int8_t*>(data)[index];
    case DType::kI32: return static_cast<float>(static_cast<const int32_t*>(data)[index]);
    case DType::kI64: return static_cast<float>(static_cast<const int64_t*>(data)[index]);
    case DType::kF64: return static_cast<float>(static_cast<const double*>(data)[index]);
    case DType::kU8: return static_cast<const uint8_t*>(data)[index];
  }
  return NAN;
}

// Writes f32 `value` as element `index` of a buffer of a float or int8 dtype.
inline void StoreFromF32(DType dtype, void* data, int64_t index, float value) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(data)[index] = value; return;
    case DType::kBF16: static_cast<BF16*>(data)[index] = BF16FromF32(value); return;
    case DType::kF16: static_cast<F16*>(data)[index] = F16FromF32(value); return;
    case DType::kF8E4M3FN: static_cast<F8E4M3FN*>(data)[index] = F8E4M3FNFromF32(value); return;
    case DType::kF8E5M2: static_cast<F8E5M2*>(data)[index] = F8E5M2FromF32(value); return;
    case DType::kI8: static_cast<int8_t*>(data)[index] = I8FromF32(value); return;
    case DType::kF64: static_cast<double*>(data)[index] = value; return;
    case DType::kI32: case DType::kI64: case DType::kU8: return;  // Never an output.
  }
}

}  // namespace rpa

#endif  // RPA_DTYPE_H_
