// The element conversions of rpa/dtype.h against known bit patterns, and
// exhaustively against an independent oracle: for every small format, the
// nearest representable value (ties to the even code) found by search over
// the format's decoded code table.
#include "rpa/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace rpa {
namespace {

float F32(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

uint16_t ToBF16(float f) { return BF16FromF32(f).bits; }
uint16_t ToF16(float f) { return F16FromF32(f).bits; }
uint8_t ToE4M3(float f) { return F8E4M3FNFromF32(f).bits; }
uint8_t ToE5M2(float f) { return F8E5M2FromF32(f).bits; }
float FromBF16(uint16_t bits) { return F32FromBF16(BF16{bits}); }
float FromF16(uint16_t bits) { return F32FromF16(F16{bits}); }
float FromE4M3(uint8_t bits) { return F32FromF8E4M3FN(F8E4M3FN{bits}); }
float FromE5M2(uint8_t bits) { return F32FromF8E5M2(F8E5M2{bits}); }

// Hex for failure messages.
std::string Hex(uint32_t v) {
  char buffer[16];
  std::snprintf(buffer, sizeof(buffer), "0x%X", v);
  return buffer;
}

// ---------------------------------------------------------------- bfloat16

TEST(DTypeBF16, ExactValues) {
  EXPECT_EQ(ToBF16(1.0f), 0x3F80);
  EXPECT_EQ(ToBF16(-2.0f), 0xC000);
  EXPECT_EQ(ToBF16(0.0f), 0x0000);
  EXPECT_EQ(ToBF16(-0.0f), 0x8000);
  EXPECT_EQ(FromBF16(0x3F80), 1.0f);
  EXPECT_EQ(FromBF16(0x4049), 3.140625f);
  EXPECT_EQ(Bits(FromBF16(0x8000)), 0x80000000u);  // -0 keeps its sign.
  EXPECT_EQ(FromBF16(0x7F7F), F32(0x7F7F0000));    // Largest finite.
}

TEST(DTypeBF16, RoundToNearestEvenTiesBothWays) {
  // Halfway between 0x3F80 (even) and 0x3F81: down to the even one.
  EXPECT_EQ(ToBF16(F32(0x3F808000)), 0x3F80);
  // Halfway between 0x3F81 and 0x3F82 (even): up.
  EXPECT_EQ(ToBF16(F32(0x3F818000)), 0x3F82);
  // Just off the tie either way.
  EXPECT_EQ(ToBF16(F32(0x3F808001)), 0x3F81);
  EXPECT_EQ(ToBF16(F32(0x3F807FFF)), 0x3F80);
  EXPECT_EQ(ToBF16(F32(0x3F81FFFF)), 0x3F82);
  // Negative ties mirror the positive ones.
  EXPECT_EQ(ToBF16(F32(0xBF808000)), 0xBF80);
  EXPECT_EQ(ToBF16(F32(0xBF818000)), 0xBF82);
  // A carry through the mantissa into the exponent.
  EXPECT_EQ(ToBF16(F32(0x3FFFC000)), 0x4000);
}

TEST(DTypeBF16, InfinityAndOverflow) {
  EXPECT_EQ(ToBF16(INFINITY), 0x7F80);
  EXPECT_EQ(ToBF16(-INFINITY), 0xFF80);
  EXPECT_EQ(FromBF16(0x7F80), INFINITY);
  EXPECT_EQ(FromBF16(0xFF80), -INFINITY);
  // FLT_MAX lies beyond the last bf16 midpoint: rounds to inf.
  EXPECT_EQ(ToBF16(FLT_MAX), 0x7F80);
  EXPECT_EQ(ToBF16(-FLT_MAX), 0xFF80);
  // Exactly the midpoint between bf16 max and 2^128: ties to even (inf).
  EXPECT_EQ(ToBF16(F32(0x7F7F8000)), 0x7F80);
  EXPECT_EQ(ToBF16(F32(0x7F7F7FFF)), 0x7F7F);
}

TEST(DTypeBF16, NaNIsQuietAndKeepsSign) {
  const uint16_t quiet = ToBF16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(quiet & 0x7F80, 0x7F80);
  EXPECT_NE(quiet & 0x0040, 0);
  EXPECT_EQ(quiet & 0x8000, 0);
  // A signalling NaN whose payload sits only in the low 16 bits must not
  // truncate to inf.
  EXPECT_EQ(ToBF16(F32(0x7F800001)), 0x7FC0);
  EXPECT_EQ(ToBF16(F32(0xFF800001)), 0xFFC0);
  EXPECT_EQ(ToBF16(F32(0x7FFFFFFF)), 0x7FFF);
  EXPECT_EQ(ToBF16(F32(0xFFC00000)), 0xFFC0);
  EXPECT_TRUE(std::isnan(FromBF16(0x7FC0)));
  EXPECT_TRUE(std::isnan(FromBF16(0x7F81)));
  EXPECT_TRUE(std::signbit(FromBF16(0xFFC0)));
}

TEST(DTypeBF16, Subnormals) {
  EXPECT_EQ(FromBF16(0x0001), F32(0x00010000));  // 2^-133.
  EXPECT_EQ(ToBF16(F32(0x00010000)), 0x0001);
  EXPECT_EQ(ToBF16(F32(0x00008000)), 0x0000);  // Tie: to even (0).
  EXPECT_EQ(ToBF16(F32(0x00018000)), 0x0002);  // Tie: to even (2).
  EXPECT_EQ(ToBF16(F32(0x00008001)), 0x0001);
  EXPECT_EQ(ToBF16(F32(0x00000001)), 0x0000);
  EXPECT_EQ(ToBF16(F32(0x80000001)), 0x8000);
  // Largest subnormal rounding into the smallest normal.
  EXPECT_EQ(ToBF16(F32(0x007FC000)), 0x0080);
  EXPECT_EQ(ToBF16(F32(0x007F0000)), 0x007F);
}

// ---------------------------------------------------------------- float16

TEST(DTypeF16, ExactValues) {
  EXPECT_EQ(ToF16(1.0f), 0x3C00);
  EXPECT_EQ(ToF16(-2.0f), 0xC000);
  EXPECT_EQ(ToF16(0.5f), 0x3800);
  EXPECT_EQ(ToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(ToF16(0.0f), 0x0000);
  EXPECT_EQ(ToF16(-0.0f), 0x8000);
  EXPECT_EQ(FromF16(0x3C00), 1.0f);
  EXPECT_EQ(FromF16(0x7BFF), 65504.0f);
  EXPECT_EQ(FromF16(0x3555), 1365.0f / 4096.0f);  // Nearest to 1/3.
  EXPECT_EQ(Bits(FromF16(0x8000)), 0x80000000u);
}

TEST(DTypeF16, RoundToNearestEvenTiesBothWays) {
  const float ulp = std::ldexp(1.0f, -10);
  EXPECT_EQ(ToF16(1.0f + ulp / 2), 0x3C00);      // Tie down to even.
  EXPECT_EQ(ToF16(1.0f + 3 * ulp / 2), 0x3C02);  // Tie up to even.
  EXPECT_EQ(ToF16(std::nextafter(1.0f + ulp / 2, 2.0f)), 0x3C01);
  EXPECT_EQ(ToF16(std::nextafter(1.0f + 3 * ulp / 2, 0.0f)), 0x3C01);
  EXPECT_EQ(ToF16(-(1.0f + ulp / 2)), 0xBC00);
  EXPECT_EQ(ToF16(-(1.0f + 3 * ulp / 2)), 0xBC02);
  // Carry into the exponent: just below 2 ties up to 2.
  EXPECT_EQ(ToF16(2.0f - ulp / 2), 0x4000);
}

TEST(DTypeF16, OverflowToInfinity) {
  EXPECT_EQ(ToF16(65519.0f), 0x7BFF);
  EXPECT_EQ(ToF16(65520.0f), 0x7C00);  // The midpoint to 2^16 ties to inf.
  EXPECT_EQ(ToF16(-65520.0f), 0xFC00);
  EXPECT_EQ(ToF16(1e10f), 0x7C00);
  EXPECT_EQ(ToF16(FLT_MAX), 0x7C00);
  EXPECT_EQ(ToF16(INFINITY), 0x7C00);
  EXPECT_EQ(ToF16(-INFINITY), 0xFC00);
  EXPECT_EQ(FromF16(0x7C00), INFINITY);
  EXPECT_EQ(FromF16(0xFC00), -INFINITY);
}

TEST(DTypeF16, NaNIsQuietAndKeepsSign) {
  for (float nan : {std::numeric_limits<float>::quiet_NaN(), F32(0x7F800001), F32(0x7FFFFFFF)}) {
    const uint16_t code = ToF16(nan);
    EXPECT_EQ(code & 0x7C00, 0x7C00) << Hex(code);
    EXPECT_NE(code & 0x0200, 0) << Hex(code);  // Quiet bit.
    EXPECT_EQ(code & 0x8000, 0) << Hex(code);
    const uint16_t negative = ToF16(-nan);
    EXPECT_EQ(negative & 0xFE00, 0xFE00) << Hex(negative);
  }
  EXPECT_TRUE(std::isnan(FromF16(0x7E00)));
  EXPECT_TRUE(std::isnan(FromF16(0x7C01)));  // Signalling.
  EXPECT_TRUE(std::signbit(FromF16(0xFE00)));
}

TEST(DTypeF16, Subnormals) {
  const float quantum = std::ldexp(1.0f, -24);
  EXPECT_EQ(FromF16(0x0001), quantum);  // Smallest subnormal 2^-24.
  EXPECT_EQ(FromF16(0x8001), -quantum);
  EXPECT_EQ(FromF16(0x03FF), 1023 * quantum);         // Largest subnormal.
  EXPECT_EQ(FromF16(0x0400), std::ldexp(1.0f, -14));  // Smallest normal.
  EXPECT_EQ(ToF16(quantum), 0x0001);
  EXPECT_EQ(ToF16(-quantum), 0x8001);
  EXPECT_EQ(ToF16(1023 * quantum), 0x03FF);
  EXPECT_EQ(ToF16(std::ldexp(1.0f, -15)), 0x0200);
  EXPECT_EQ(ToF16(quantum / 2), 0x0000);   // Tie: to even (0).
  EXPECT_EQ(ToF16(-quantum / 2), 0x8000);  // Keeps the sign.
  EXPECT_EQ(ToF16(std::nextafter(quantum / 2, 1.0f)), 0x0001);
  EXPECT_EQ(ToF16(1.5f * quantum), 0x0002);     // Tie: to even (2).
  EXPECT_EQ(ToF16(2.5f * quantum), 0x0002);     // Tie: to even (2).
  EXPECT_EQ(ToF16(1023.5f * quantum), 0x0400);  // Into the smallest normal.
  EXPECT_EQ(ToF16(1023.25f * quantum), 0x03FF);
  EXPECT_EQ(ToF16(1022.5f * quantum), 0x03FE);
  EXPECT_EQ(ToF16(std::ldexp(1.0f, -30)), 0x0000);  // Underflow.
  EXPECT_EQ(ToF16(F32(0x00000001)), 0x0000);        // f32 subnormal.
}

// ---------------------------------------------------------------- fp8 e4m3fn

TEST(DTypeF8E4M3FN, ExactValues) {
  EXPECT_EQ(ToE4M3(1.0f), 0x38);
  EXPECT_EQ(ToE4M3(-1.0f), 0xB8);
  EXPECT_EQ(ToE4M3(448.0f), 0x7E);
  EXPECT_EQ(ToE4M3(-448.0f), 0xFE);
  EXPECT_EQ(ToE4M3(256.0f), 0x78);
  EXPECT_EQ(ToE4M3(0.0f), 0x00);
  EXPECT_EQ(ToE4M3(-0.0f), 0x80);
  EXPECT_EQ(FromE4M3(0x7E), 448.0f);
  EXPECT_EQ(FromE4M3(0xFE), -448.0f);
  EXPECT_EQ(FromE4M3(0x78), 256.0f);  // Exponent 15 is finite in e4m3fn.
  EXPECT_EQ(FromE4M3(0x38), 1.0f);
  EXPECT_EQ(Bits(FromE4M3(0x80)), 0x80000000u);
}

TEST(DTypeF8E4M3FN, RoundToNearestEven) {
  EXPECT_EQ(ToE4M3(1.0625f), 0x38);  // Tie between 1 and 1.125: down.
  EXPECT_EQ(ToE4M3(1.1875f), 0x3A);  // Tie between 1.125 and 1.25: up.
  EXPECT_EQ(ToE4M3(std::nextafter(1.0625f, 2.0f)), 0x39);
  EXPECT_EQ(ToE4M3(-1.1875f), 0xBA);
  EXPECT_EQ(ToE4M3(1.9375f), 0x40);  // Carry into the exponent.
}

TEST(DTypeF8E4M3FN, SaturatesAndNaN) {
  EXPECT_EQ(ToE4M3(1000.0f), 0x7E);
  EXPECT_EQ(ToE4M3(-1000.0f), 0xFE);
  EXPECT_EQ(ToE4M3(464.0f), 0x7E);  // Midpoint above max.
  EXPECT_EQ(ToE4M3(470.0f), 0x7E);  // Would round onto the NaN code.
  EXPECT_EQ(ToE4M3(FLT_MAX), 0x7E);
  EXPECT_EQ(ToE4M3(INFINITY), 0x7E);
  EXPECT_EQ(ToE4M3(-INFINITY), 0xFE);
  EXPECT_EQ(ToE4M3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(ToE4M3(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(ToE4M3(F32(0x7F800001)), 0x7F);
  EXPECT_TRUE(std::isnan(FromE4M3(0x7F)));
  EXPECT_TRUE(std::isnan(FromE4M3(0xFF)));
  EXPECT_TRUE(std::signbit(FromE4M3(0xFF)));
}

TEST(DTypeF8E4M3FN, Subnormals) {
  const float quantum = std::ldexp(1.0f, -9);
  EXPECT_EQ(FromE4M3(0x01), quantum);
  EXPECT_EQ(FromE4M3(0x07), 7 * quantum);
  EXPECT_EQ(FromE4M3(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(ToE4M3(quantum), 0x01);
  EXPECT_EQ(ToE4M3(-quantum), 0x81);
  EXPECT_EQ(ToE4M3(quantum / 2), 0x00);  // Tie to even.
  EXPECT_EQ(ToE4M3(-quantum / 2), 0x80);
  EXPECT_EQ(ToE4M3(1.5f * quantum), 0x02);  // Tie to even.
  EXPECT_EQ(ToE4M3(7 * quantum), 0x07);
  EXPECT_EQ(ToE4M3(7.5f * quantum), 0x08);  // Into the smallest normal.
  EXPECT_EQ(ToE4M3(std::ldexp(1.0f, -12)), 0x00);
}

// ---------------------------------------------------------------- fp8 e5m2

TEST(DTypeF8E5M2, ExactValues) {
  EXPECT_EQ(ToE5M2(1.0f), 0x3C);
  EXPECT_EQ(ToE5M2(-1.0f), 0xBC);
  EXPECT_EQ(ToE5M2(57344.0f), 0x7B);
  EXPECT_EQ(ToE5M2(-57344.0f), 0xFB);
  EXPECT_EQ(ToE5M2(-0.0f), 0x80);
  EXPECT_EQ(FromE5M2(0x7B), 57344.0f);
  EXPECT_EQ(FromE5M2(0x3C), 1.0f);
  EXPECT_EQ(FromE5M2(0x7C), INFINITY);
  EXPECT_EQ(FromE5M2(0xFC), -INFINITY);
}

TEST(DTypeF8E5M2, RoundToNearestEven) {
  EXPECT_EQ(ToE5M2(1.125f), 0x3C);  // Tie between 1 and 1.25: down.
  EXPECT_EQ(ToE5M2(1.375f), 0x3E);  // Tie between 1.25 and 1.5: up.
  EXPECT_EQ(ToE5M2(std::nextafter(1.125f, 2.0f)), 0x3D);
  EXPECT_EQ(ToE5M2(1.875f), 0x40);  // Carry into the exponent.
}

TEST(DTypeF8E5M2, SaturatesFiniteKeepsInfAndNaN) {
  EXPECT_EQ(ToE5M2(60000.0f), 0x7B);
  EXPECT_EQ(ToE5M2(61440.0f), 0x7B);  // Midpoint to 2^16.
  EXPECT_EQ(ToE5M2(1e10f), 0x7B);
  EXPECT_EQ(ToE5M2(-1e10f), 0xFB);
  EXPECT_EQ(ToE5M2(FLT_MAX), 0x7B);
  EXPECT_EQ(ToE5M2(INFINITY), 0x7C);
  EXPECT_EQ(ToE5M2(-INFINITY), 0xFC);
  for (float nan : {std::numeric_limits<float>::quiet_NaN(), F32(0x7F800001)}) {
    const uint8_t code = ToE5M2(nan);
    EXPECT_EQ(code & 0x7C, 0x7C) << Hex(code);
    EXPECT_NE(code & 0x03, 0) << Hex(code);
    EXPECT_EQ(code & 0x80, 0) << Hex(code);
    EXPECT_EQ(ToE5M2(-nan) & 0x80, 0x80);
  }
  EXPECT_TRUE(std::isnan(FromE5M2(0x7D)));
  EXPECT_TRUE(std::isnan(FromE5M2(0x7E)));
  EXPECT_TRUE(std::isnan(FromE5M2(0xFF)));
}

TEST(DTypeF8E5M2, Subnormals) {
  const float quantum = std::ldexp(1.0f, -16);
  EXPECT_EQ(FromE5M2(0x01), quantum);
  EXPECT_EQ(FromE5M2(0x03), 3 * quantum);
  EXPECT_EQ(FromE5M2(0x04), std::ldexp(1.0f, -14));
  EXPECT_EQ(ToE5M2(quantum), 0x01);
  EXPECT_EQ(ToE5M2(quantum / 2), 0x00);
  EXPECT_EQ(ToE5M2(1.5f * quantum), 0x02);
  EXPECT_EQ(ToE5M2(3.5f * quantum), 0x04);  // Into the smallest normal.
  EXPECT_EQ(ToE5M2(-quantum), 0x81);
}

// ---------------------------------------------------------------- int8

TEST(DTypeI8, RoundToNearestEvenAndSaturate) {
  EXPECT_EQ(I8FromF32(2.5f), 2);
  EXPECT_EQ(I8FromF32(3.5f), 4);
  EXPECT_EQ(I8FromF32(-2.5f), -2);
  EXPECT_EQ(I8FromF32(-3.5f), -4);
  EXPECT_EQ(I8FromF32(0.5f), 0);
  EXPECT_EQ(I8FromF32(-0.5f), 0);
  EXPECT_EQ(I8FromF32(1.49f), 1);
  EXPECT_EQ(I8FromF32(1.51f), 2);
  EXPECT_EQ(I8FromF32(127.0f), 127);
  EXPECT_EQ(I8FromF32(127.5f), 127);
  EXPECT_EQ(I8FromF32(1000.0f), 127);
  EXPECT_EQ(I8FromF32(-128.0f), -128);
  EXPECT_EQ(I8FromF32(-128.5f), -128);
  EXPECT_EQ(I8FromF32(-1e30f), -128);
  EXPECT_EQ(I8FromF32(INFINITY), 127);
  EXPECT_EQ(I8FromF32(-INFINITY), -128);
  EXPECT_EQ(I8FromF32(std::numeric_limits<float>::quiet_NaN()), 0);
  EXPECT_EQ(I8FromF32(-std::numeric_limits<float>::quiet_NaN()), 0);
  for (int v = -128; v <= 127; ++v) EXPECT_EQ(I8FromF32(static_cast<float>(v)), v);
}

// ------------------------------------------- exhaustive, per small format

struct Format {
  const char* name;
  int bits;         // 8 or 16.
  bool saturating;  // Finite overflow gives max (fp8) or inf (f16, bf16).
  float (*decode)(uint32_t);
  uint32_t (*encode)(float);
};

const Format kFormats[] = {
    {"bf16", 16, false, [](uint32_t c) { return FromBF16(static_cast<uint16_t>(c)); },
     [](float f) -> uint32_t { return ToBF16(f); }},
    {"f16", 16, false, [](uint32_t c) { return FromF16(static_cast<uint16_t>(c)); },
     [](float f) -> uint32_t { return ToF16(f); }},
    {"e4m3fn", 8, true, [](uint32_t c) { return FromE4M3(static_cast<uint8_t>(c)); },
     [](float f) -> uint32_t { return ToE4M3(f); }},
    {"e5m2", 8, true, [](uint32_t c) { return FromE5M2(static_cast<uint8_t>(c)); },
     [](float f) -> uint32_t { return ToE5M2(f); }},
};

class DTypeFormatTest : public ::testing::TestWithParam<Format> {};

// Every code decodes and re-encodes to itself; NaN codes to a NaN code of
// the same sign.
TEST_P(DTypeFormatTest, EveryCodeRoundTrips) {
  const Format& format = GetParam();
  const uint32_t sign_bit = 1u << (format.bits - 1);
  int failures = 0;
  for (uint32_t code = 0; code < (1u << format.bits) && failures < 5; ++code) {
    const float value = format.decode(code);
    const uint32_t back = format.encode(value);
    if (std::isnan(value)) {
      const bool ok = std::isnan(format.decode(back)) && (back & sign_bit) == (code & sign_bit);
      if (!ok) {
        ++failures;
        ADD_FAILURE() << format.name << " NaN code " << Hex(code) << " re-encodes to " << Hex(back);
      }
    } else if (back != code) {
      ++failures;
      ADD_FAILURE() << format.name << " code " << Hex(code) << " = " << value << " re-encodes to "
                    << Hex(back);
    }
  }
}

// Positive finite values of a format in increasing order, with their codes.
struct Table {
  std::vector<double> values;
  std::vector<uint32_t> codes;
  uint32_t inf_code = 0;  // 0 when the format has no infinity.
};

Table MakeTable(const Format& format) {
  Table table;
  const uint32_t sign_bit = 1u << (format.bits - 1);
  for (uint32_t code = 0; code < sign_bit; ++code) {
    const float v = format.decode(code);
    if (std::isnan(v)) continue;
    if (std::isinf(v)) {
      table.inf_code = code;
      continue;
    }
    table.values.push_back(v);
    table.codes.push_back(code);
  }
  for (size_t i = 1; i < table.values.size(); ++i) {
    EXPECT_LT(table.values[i - 1], table.values[i]) << format.name << " not monotonic";
  }
  return table;
}

// Round to nearest, ties to the even code, by search; overflow: ties at the
// midpoint beyond max go to the next (virtual) code, which is even.
uint32_t Oracle(const Format& format, const Table& table, float f) {
  const uint32_t sign = std::signbit(f) ? 1u << (format.bits - 1) : 0;
  const double x = std::fabs(static_cast<double>(f));
  const double max = table.values.back();
  const double max_ulp = max - table.values[table.values.size() - 2];
  const uint32_t overflow = format.saturating ? table.codes.back() : table.inf_code;
  if (std::isinf(x)) return sign | (table.inf_code ? table.inf_code : table.codes.back());
  if (x >= max + max_ulp / 2) return sign | overflow;  // Tie: the even virtual code.
  const auto it = std::lower_bound(table.values.begin(), table.values.end(), x);
  if (it == table.values.end()) return sign | table.codes.back();
  const size_t hi = static_cast<size_t>(it - table.values.begin());
  if (table.values[hi] == x || hi == 0) return sign | table.codes[hi];
  const size_t lo = hi - 1;
  const double d_lo = x - table.values[lo];
  const double d_hi = table.values[hi] - x;
  if (d_lo < d_hi) return sign | table.codes[lo];
  if (d_hi < d_lo) return sign | table.codes[hi];
  return sign | ((table.codes[lo] & 1) == 0 ? table.codes[lo] : table.codes[hi]);
}

// Every value, every midpoint between neighbours and one f32 step either side
// of it, plus random f32 bit patterns: encode agrees with the oracle.
TEST_P(DTypeFormatTest, EncodeMatchesNearestEvenOracle) {
  const Format& format = GetParam();
  const Table table = MakeTable(format);
  std::vector<float> inputs;
  for (size_t i = 0; i < table.values.size(); ++i) {
    const float v = static_cast<float>(table.values[i]);
    inputs.push_back(v);
    const double exact_mid =
        i + 1 < table.values.size()
            ? (table.values[i] + table.values[i + 1]) / 2
            : table.values[i] + (table.values[i] - table.values[i - 1]) / 2;  // Overflow edge.
    const float mid = static_cast<float>(exact_mid);
    ASSERT_EQ(static_cast<double>(mid), exact_mid) << "midpoint not exact in f32";
    for (float m : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      inputs.push_back(m);
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) inputs.push_back(F32(static_cast<uint32_t>(rng())));
  inputs.push_back(FLT_MAX);
  inputs.push_back(INFINITY);
  inputs.push_back(std::ldexp(1.0f, -149));
  int failures = 0;
  for (float magnitude : inputs) {
    if (std::isnan(magnitude)) continue;
    for (float f : {magnitude, -magnitude}) {
      const uint32_t expected = Oracle(format, table, f);
      const uint32_t got = format.encode(f);
      if (got != expected && ++failures <= 5) {
        ADD_FAILURE() << format.name << "(" << f << " = f32 " << Hex(Bits(f)) << ") gave "
                      << Hex(got) << ", nearest-even is " << Hex(expected);
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, DTypeFormatTest, ::testing::ValuesIn(kFormats),
                         [](const ::testing::TestParamInfo<Format>& param_info) {
                           return std::string(param_info.param.name);
                         });

// ---------------------------------------------------------- load and store

TEST(DTypeLoadStore, RoundTripThroughEveryStorageType) {
  for (DType dtype :
       {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8}) {
    std::vector<uint8_t> buffer(4 * SizeOf(dtype), 0xAB);
    const float values[] = {1.0f, -2.0f, 0.5f, 3.0f};
    for (int i = 0; i < 4; ++i) StoreFromF32(dtype, buffer.data(), i, values[i]);
    for (int i = 0; i < 4; ++i) {
      const float expected = dtype == DType::kI8 && values[i] == 0.5f ? 0.0f : values[i];
      EXPECT_EQ(LoadAsF32(dtype, buffer.data(), i), expected) << ToString(dtype) << " " << i;
    }
  }
  const int32_t ints[] = {-7, 123456};
  EXPECT_EQ(LoadAsF32(DType::kI32, ints, 1), 123456.0f);
  const uint8_t bytes[] = {200};
  EXPECT_EQ(LoadAsF32(DType::kU8, bytes, 0), 200.0f);
  EXPECT_EQ(LoadAsF32(DType::kI8, bytes, 0), -56.0f);
}

// ------------------------------------------------------------- names, sizes

TEST(DTypeNames, ToStringFromStringAndSizeOf) {
  struct Expected {
    DType dtype;
    const char* name;
    const char* short_name;
    size_t size;
  };
  const Expected all[] = {
      {DType::kF32, "float32", "f32", 4},
      {DType::kBF16, "bfloat16", "bf16", 2},
      {DType::kF16, "float16", "f16", 2},
      {DType::kF8E4M3FN, "float8_e4m3fn", "fp8_e4m3", 1},
      {DType::kF8E5M2, "float8_e5m2", "fp8_e5m2", 1},
      {DType::kI8, "int8", "i8", 1},
      {DType::kI32, "int32", nullptr, 4},
      {DType::kI64, "int64", nullptr, 8},
      {DType::kF64, "float64", nullptr, 8},
      {DType::kU8, "uint8", nullptr, 1},
  };
  for (const Expected& e : all) {
    EXPECT_EQ(ToString(e.dtype), e.name);
    EXPECT_EQ(DTypeFromString(e.name), e.dtype) << e.name;
    if (e.short_name) {
      EXPECT_EQ(DTypeFromString(e.short_name), e.dtype) << e.short_name;
    }
    EXPECT_EQ(SizeOf(e.dtype), e.size) << e.name;
  }
  EXPECT_EQ(DTypeFromString("e4m3"), DType::kF8E4M3FN);
  EXPECT_EQ(DTypeFromString("e5m2"), DType::kF8E5M2);
  EXPECT_EQ(DTypeFromString(""), std::nullopt);
  EXPECT_EQ(DTypeFromString("float"), std::nullopt);
  EXPECT_EQ(DTypeFromString("Float32"), std::nullopt);
  EXPECT_EQ(DTypeFromString("float8_e4m3"), std::nullopt);  // Not the fn type's name.
  static_assert(SizeOf(DType::kBF16) == sizeof(BF16));
  static_assert(SizeOf(DType::kF16) == sizeof(F16));
  static_assert(SizeOf(DType::kF8E4M3FN) == sizeof(F8E4M3FN));
  static_assert(SizeOf(DType::kF8E5M2) == sizeof(F8E5M2));
  static_assert(ToString(DType::kBF16) == "bfloat16");
  static_assert(*DTypeFromString("bf16") == DType::kBF16);
}

}  // namespace
}  // namespace rpa
