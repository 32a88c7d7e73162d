// The AMX building blocks (kernel/amx.h, kernel/bf16_pairs.h, and
// testing/amx_experimental.h's) against plain f64 loops over the
// same bf16 inputs: packs element by element, products on a sampled grid of
// rows x keys x head_dim x K/V dtype, on the hardware's tiles (skipped where
// AmxSupport() is not usable, with its reason) and on the scalar tile model
// (which runs the same tile programs wherever AVX-512 BF16 is). Padding is
// filled with NaN (Highway's style): NaN just past every cache row, in q's
// padding rows and dims, in p past n, in acc past the rows and dims; none may
// reach a result, and nothing past the documented extents may be written.
#include "kernel/amx.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernel/bf16_pairs.h"
#include "kernel/cpu_features.h"
#include "kernel/tile_kernel.h"
#include "rpa/dtype.h"
#include "testing/amx_emulation.h"
#include "testing/amx_experimental.h"
#include "threads/thread_pool.h"

namespace rpa::internal {
namespace {

#if !defined(__x86_64__)

TEST(AmxSupport, NotX86) {
  EXPECT_FALSE(AmxSupport().usable);
  EXPECT_EQ(AmxSupport().reason, "not x86-64");
}

#else

using testing::AmxBackend;
using testing::AmxBf16PeakGflops;
using testing::AmxDecodeLogitsT;
using testing::AmxDecodeScratchElems;
using testing::AmxLogits;
using testing::AmxLogitsAdd;
using testing::AmxPackedQtElems;
using testing::AmxPackQt;
using testing::AmxPv;
using testing::AmxPvBf16;

TEST(AmxSupport, ReportsWhy) {
  const AmxStatus& status = AmxSupport();
  EXPECT_FALSE(status.reason.empty());
  if (status.usable) {
    EXPECT_EQ(status.reason, "AMX bf16 tiles usable");
  } else {
    EXPECT_NE(status.reason, "AMX bf16 tiles usable");
  }
  EXPECT_EQ(&AmxSupport(), &status);  // Computed once.
  std::printf("AmxSupport: %s\n", status.reason.c_str());
}

TEST(AmxSupport, PeakProbe) {
  const double gflops = AmxBf16PeakGflops(0.02);
  if (!AmxSupport().usable) {
    EXPECT_EQ(gflops, 0.0);
    GTEST_SKIP() << AmxSupport().reason;
  }
  EXPECT_GT(gflops, 10.0);
  std::printf("AMX bf16 peak, 1 thread: %.0f GFLOP/s\n", gflops);
}

const char* DtypeName(DType d) {
  switch (d) {
    case DType::kBF16: return "bf16";
    case DType::kF8E4M3FN: return "e4m3fn";
    case DType::kF8E5M2: return "e5m2";
    case DType::kI8: return "int8";
    default: return "other";
  }
}

// The byte of each dtype's NaN (int8 has none: its largest value).
uint8_t NanCode(DType d) { return d == DType::kF8E5M2 ? 0x7E : 0x7F; }

// n cache rows of head_dim elements, 64 bytes of NaN codes after each, in a
// scrambled order in one buffer (in_order: equally far apart, as in a
// page); values[i * head_dim + d] is the true value.
struct CacheRows {
  std::vector<uint8_t> bytes;
  std::vector<const void*> rows;
  std::vector<double> values;
};

CacheRows MakeRows(DType dtype, int64_t n, int64_t head_dim, uint32_t seed,
                   bool in_order = false) {
  const int64_t elem = static_cast<int64_t>(SizeOf(dtype));
  const int64_t stride = head_dim * elem + 64;
  CacheRows c;
  c.bytes.resize(static_cast<size_t>(n * stride));
  for (size_t b = 0; b < c.bytes.size(); ++b) {
    c.bytes[b] = dtype == DType::kBF16 ? (b % 2 ? 0x7F : 0xC0) : NanCode(dtype);
  }
  std::vector<int64_t> slot(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) slot[i] = i;
  std::mt19937 rng(seed);
  if (!in_order) std::shuffle(slot.begin(), slot.end(), rng);
  std::normal_distribution<float> normal;
  c.rows.resize(static_cast<size_t>(n));
  c.values.resize(static_cast<size_t>(n * head_dim));
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* row = c.bytes.data() + slot[i] * stride;
    c.rows[i] = row;
    for (int64_t d = 0; d < head_dim; ++d) {
      const float x = normal(rng);
      switch (dtype) {
        case DType::kBF16: StoreFromF32(dtype, row, d, x); break;
        case DType::kF8E4M3FN: StoreFromF32(dtype, row, d, 16.0f * x); break;
        case DType::kF8E5M2: StoreFromF32(dtype, row, d, 16.0f * x); break;
        default: StoreFromF32(dtype, row, d, 40.0f * x); break;
      }
      c.values[i * head_dim + d] = LoadAsF32(dtype, row, d);
    }
  }
  return c;
}

float NanF32(uint32_t payload) {
  const uint32_t bits = 0x7FC00000u | payload;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float Bf16Value(uint16_t bits) { return F32FromBF16(BF16{bits}); }

bool CanRun(AmxBackend backend, std::string* why) {
  if (backend == AmxBackend::kHardware && !AmxSupport().usable) {
    *why = AmxSupport().reason;
    return false;
  }
  if (!DetectedCpuFeatures().avx512bf16) {
    *why = "no AVX-512 BF16 (the packs and the weights' conversion)";
    return false;
  }
  return true;
}

// ---- Packs, element by element.

uint16_t ExpectedBf16(DType dtype, const void* row, int64_t d) {
  if (dtype == DType::kBF16) {
    uint16_t b;
    std::memcpy(&b, static_cast<const uint8_t*>(row) + 2 * d, 2);
    return b;
  }
  return BF16FromF32(LoadAsF32(dtype, row, d)).bits;
}

class AmxPackTest : public ::testing::TestWithParam<DType> {};

TEST_P(AmxPackTest, LayoutsMatchWithNanCodes) {
  std::string why;
  if (!CanRun(AmxBackend::kEmulated, &why)) GTEST_SKIP() << why;
  const DType dtype = GetParam();
  for (int64_t head_dim : {1, 5, 31, 32, 33, 80, 128, 255, 256}) {
    for (int64_t n : {1, 15, 16, 17, 33, 100}) {
      CacheRows c = MakeRows(dtype, n, head_dim, static_cast<uint32_t>(head_dim * 1000 + n));
      // Every code once somewhere (NaN codes and subnormals included).
      if (dtype != DType::kBF16) {
        for (int code = 0; code < 256; ++code) {
          const int64_t at = code % (n * head_dim);
          const_cast<uint8_t*>(static_cast<const uint8_t*>(c.rows[at / head_dim]))[at % head_dim] =
              static_cast<uint8_t>(code);
        }
      }
      const int64_t n32 = RoundUp(n, 32), dim32 = RoundUp(head_dim, 32);
      const int64_t d16 = RoundUp(head_dim, 16);
      std::vector<uint16_t> kp(AmxPackedKeysElems(n, head_dim) + 64, 0xABCD);
      std::vector<uint16_t> vp(AmxPackedValuesElems(n, head_dim) + 64, 0xABCD);
      AmxPackKeys({dtype, c.rows.data(), n, head_dim, kp.data()});
      AmxPackValues({dtype, c.rows.data(), n, head_dim, vp.data()});
      SCOPED_TRACE("n " + std::to_string(n) + " head_dim " + std::to_string(head_dim));
      int64_t bad = 0;
      for (int64_t i = 0; i < n32; ++i) {
        for (int64_t d = 0; d < dim32; ++d) {
          const uint16_t want = i < n && d < head_dim ? ExpectedBf16(dtype, c.rows[i], d) : 0;
          bad += kp[(d / 2) * 2 * n32 + 2 * i + d % 2] != want;
          if (d < d16) bad += vp[(i / 2) * 2 * d16 + 2 * d + i % 2] != want;
        }
      }
      EXPECT_EQ(bad, 0);
      for (size_t e = kp.size() - 64; e < kp.size(); ++e) EXPECT_EQ(kp[e], 0xABCD);
      for (size_t e = vp.size() - 64; e < vp.size(); ++e) EXPECT_EQ(vp[e], 0xABCD);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AmxPackTest,
                         ::testing::Values(DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2,
                                           DType::kI8),
                         [](const ::testing::TestParamInfo<DType>& param_info) {
                           return std::string(DtypeName(param_info.param));
                         });

// ---- Products.

struct ProductCase {
  int64_t rows, n, head_dim;
  DType dtype;
  AmxBackend backend;
};

std::string CaseName(const ProductCase& c) {
  return std::string(c.backend == AmxBackend::kHardware ? "Hardware" : "Emulated") + "_rows" +
         std::to_string(c.rows) + "_n" + std::to_string(c.n) + "_hd" +
         std::to_string(c.head_dim) + "_" + DtypeName(c.dtype);
}

// Every (head_dim, n) pair once per backend, rows and dtype cycling through
// their lists (each row count and dtype appears with many of both).
std::vector<ProductCase> SampledGrid() {
  const int64_t rows[] = {1, 3, 15, 16, 17, 33, 64, 128, 255};
  const int64_t keys[] = {1, 7, 15, 16, 17, 31, 32, 33, 100, 256};
  const int64_t dims[] = {1, 5, 31, 32, 33, 64, 80, 96, 100, 128, 255, 256};
  const DType dtypes[] = {DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8};
  std::vector<ProductCase> cases;
  for (AmxBackend backend : {AmxBackend::kHardware, AmxBackend::kEmulated}) {
    for (int h = 0; h < 12; ++h) {
      for (int k = 0; k < 10; ++k) {
        cases.push_back({rows[(7 * h + 3 * k) % 9], keys[k], dims[h], dtypes[(h + 2 * k) % 4],
                         backend});
      }
    }
  }
  return cases;
}

// q [rows16][q_stride] bf16: values for rows < rows and dims < head_dim, zero
// for dims [head_dim, dim32), NaN past dim32 and in rows >= rows.
struct QRows {
  int64_t stride;
  std::vector<uint16_t> bits;
};

QRows MakeQ(int64_t rows, int64_t head_dim, uint32_t seed) {
  QRows q;
  const int64_t dim32 = RoundUp(head_dim, 32), rows16 = RoundUp(rows, 16);
  q.stride = dim32 + 32;
  q.bits.assign(static_cast<size_t>(rows16 * q.stride), 0x7FC1);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t d = 0; d < dim32; ++d) {
      q.bits[r * q.stride + d] = d < head_dim ? BF16FromF32(normal(rng)).bits : 0;
    }
  }
  return q;
}

// s = q K^T on the tiles; s's extents outside [RoundUp(rows, 16)][RoundUp(n,
// 16)] must stay as they were.
struct Logits {
  int64_t stride;
  std::vector<float> s;
};

Logits RunLogits(const ProductCase& c, const QRows& q, const CacheRows& k) {
  std::vector<uint16_t> kp(AmxPackedKeysElems(c.n, c.head_dim));
  AmxPackKeys({c.dtype, k.rows.data(), c.n, c.head_dim, kp.data()});
  Logits out;
  out.stride = RoundUp(c.n, 16) + 16;
  out.s.assign(static_cast<size_t>((RoundUp(c.rows, 16) + 1) * out.stride), NanF32(0x77));
  AmxLogits({q.bits.data(), q.stride, c.rows, kp.data(), c.n, c.head_dim, out.s.data(),
             out.stride},
            c.backend);
  return out;
}

class AmxProductTest : public ::testing::TestWithParam<ProductCase> {};

TEST_P(AmxProductTest, LogitsMatchF64) {
  const ProductCase c = GetParam();
  std::string why;
  if (!CanRun(c.backend, &why)) GTEST_SKIP() << why;
  const CacheRows k = MakeRows(c.dtype, c.n, c.head_dim, 11);
  const QRows q = MakeQ(c.rows, c.head_dim, 12);
  const Logits got = RunLogits(c, q, k);
  int64_t bad = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < c.n; ++i) {
      double want = 0, bound = 0;
      for (int64_t d = 0; d < c.head_dim; ++d) {
        const double prod = Bf16Value(q.bits[r * q.stride + d]) * k.values[i * c.head_dim + d];
        want += prod;
        bound += std::fabs(prod);
      }
      const double s = got.s[r * got.stride + i];
      if (!(std::fabs(s - want) <= 1e-5 * bound + 1e-30)) {
        if (++bad <= 5) ADD_FAILURE() << "s[" << r << "][" << i << "] " << s << " want " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  const int64_t rows16 = RoundUp(c.rows, 16), n16 = RoundUp(c.n, 16);
  int64_t touched = 0;
  for (int64_t r = 0; r <= rows16; ++r) {
    for (int64_t i = 0; i < got.stride; ++i) {
      if (r < rows16 && i < n16) continue;
      touched += Bits(got.s[r * got.stride + i]) != Bits(NanF32(0x77));
    }
  }
  EXPECT_EQ(touched, 0) << "s written outside [RoundUp(rows, 16)][RoundUp(n, 16)]";
}

// q = hi + lo as two bf16 rows (f32 q on the tiles): the second call adds.
TEST_P(AmxProductTest, LogitsAccumulateHiLo) {
  const ProductCase c = GetParam();
  std::string why;
  if (!CanRun(c.backend, &why)) GTEST_SKIP() << why;
  const CacheRows k = MakeRows(c.dtype, c.n, c.head_dim, 13);
  const QRows hi = MakeQ(c.rows, c.head_dim, 14);
  QRows lo = hi;
  for (uint16_t& b : lo.bits) {
    if ((b & 0x7FFF) != 0 && (b & 0x7F80) != 0x7F80) b = BF16FromF32(Bf16Value(b) / 512.0f).bits;
  }
  std::vector<uint16_t> kp(AmxPackedKeysElems(c.n, c.head_dim));
  AmxPackKeys({c.dtype, k.rows.data(), c.n, c.head_dim, kp.data()});
  const int64_t stride = RoundUp(c.n, 16);
  std::vector<float> s(static_cast<size_t>(RoundUp(c.rows, 16) * stride));
  AmxLogits({hi.bits.data(), hi.stride, c.rows, kp.data(), c.n, c.head_dim, s.data(), stride},
            c.backend);
  AmxLogitsAdd({lo.bits.data(), lo.stride, c.rows, kp.data(), c.n, c.head_dim, s.data(), stride},
               c.backend);
  int64_t bad = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < c.n; ++i) {
      double want = 0, bound = 0;
      for (int64_t d = 0; d < c.head_dim; ++d) {
        const double q = static_cast<double>(Bf16Value(hi.bits[r * hi.stride + d])) +
                         Bf16Value(lo.bits[r * lo.stride + d]);
        want += q * k.values[i * c.head_dim + d];
        bound += std::fabs(q * k.values[i * c.head_dim + d]);
      }
      bad += !(std::fabs(s[r * stride + i] - want) <= 2e-5 * bound + 1e-30);
    }
  }
  EXPECT_EQ(bad, 0);
}

// acc += bf16(p) V on the tiles. p: [rows][n + 5] in [0, 1), NaN past n.
// acc: [rows16 + 1][d16 + 16], random where it counts, NaN elsewhere.
struct PvData {
  int64_t p_stride, acc_stride;
  std::vector<float> p, acc0;
};

PvData MakePv(const ProductCase& c, uint32_t seed) {
  PvData d;
  d.p_stride = c.n + 5;
  d.acc_stride = RoundUp(c.head_dim, 16) + 16;
  d.p.assign(static_cast<size_t>(c.rows * d.p_stride), NanF32(0x55));
  d.acc0.assign(static_cast<size_t>((RoundUp(c.rows, 16) + 1) * d.acc_stride), NanF32(0x66));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::normal_distribution<float> normal;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < c.n; ++i) d.p[r * d.p_stride + i] = uniform(rng);
    for (int64_t e = 0; e < c.head_dim; ++e) d.acc0[r * d.acc_stride + e] = normal(rng);
  }
  return d;
}

std::vector<float> RunPv(const ProductCase& c, const PvData& d, const CacheRows& v) {
  std::vector<uint16_t> vp(AmxPackedValuesElems(c.n, c.head_dim));
  AmxPackValues({c.dtype, v.rows.data(), c.n, c.head_dim, vp.data()});
  std::vector<uint16_t> scratch(AmxPvScratchElems(c.rows, c.n) + 32, 0xABCD);
  std::vector<float> acc = d.acc0;
  AmxPv({d.p.data(), d.p_stride, c.rows, vp.data(), c.n, c.head_dim, acc.data(), d.acc_stride,
         scratch.data()},
        c.backend);
  for (size_t e = scratch.size() - 32; e < scratch.size(); ++e) EXPECT_EQ(scratch[e], 0xABCD);
  return acc;
}

TEST_P(AmxProductTest, PvMatchesF64) {
  const ProductCase c = GetParam();
  std::string why;
  if (!CanRun(c.backend, &why)) GTEST_SKIP() << why;
  const CacheRows v = MakeRows(c.dtype, c.n, c.head_dim, 21);
  const PvData d = MakePv(c, 22);
  const std::vector<float> acc = RunPv(c, d, v);
  int64_t bad = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t e = 0; e < c.head_dim; ++e) {
      double want = d.acc0[r * d.acc_stride + e], bound = std::fabs(want);
      for (int64_t i = 0; i < c.n; ++i) {
        const double w = F32FromBF16(BF16FromF32(d.p[r * d.p_stride + i]));
        want += w * v.values[i * c.head_dim + e];
        bound += std::fabs(w * v.values[i * c.head_dim + e]);
      }
      const double got = acc[r * d.acc_stride + e];
      if (!(std::fabs(got - want) <= 1e-5 * bound + 1e-30)) {
        if (++bad <= 5) {
          ADD_FAILURE() << "acc[" << r << "][" << e << "] " << got << " want " << want;
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
  const int64_t rows16 = RoundUp(c.rows, 16), d16 = RoundUp(c.head_dim, 16);
  int64_t touched = 0;
  for (int64_t r = 0; r <= rows16; ++r) {
    for (int64_t e = 0; e < d.acc_stride; ++e) {
      if (r < rows16 && e < d16) continue;
      touched += Bits(acc[r * d.acc_stride + e]) != Bits(d.acc0[r * d.acc_stride + e]);
    }
  }
  EXPECT_EQ(touched, 0) << "acc written outside [RoundUp(rows, 16)][RoundUp(head_dim, 16)]";
}

// AmxPvBf16 straight from bf16 weights with a wider stride and NaN in the
// padding rows (they reach only acc's padding rows), = AmxPv bit for bit.
TEST_P(AmxProductTest, PvBf16MatchesPv) {
  const ProductCase c = GetParam();
  std::string why;
  if (!CanRun(c.backend, &why)) GTEST_SKIP() << why;
  const CacheRows v = MakeRows(c.dtype, c.n, c.head_dim, 23);
  const PvData d = MakePv(c, 24);
  const std::vector<float> want = RunPv(c, d, v);
  std::vector<uint16_t> vp(AmxPackedValuesElems(c.n, c.head_dim));
  AmxPackValues({c.dtype, v.rows.data(), c.n, c.head_dim, vp.data()});
  const int64_t rows16 = RoundUp(c.rows, 16), n32 = RoundUp(c.n, 32), stride = n32 + 32;
  std::vector<uint16_t> packed(AmxPvScratchElems(c.rows, c.n));
  AmxWeightsToBf16(d.p.data(), d.p_stride, c.rows, c.n, packed.data());
  std::vector<uint16_t> pb(static_cast<size_t>(rows16 * stride), 0x7FC0);
  for (int64_t r = 0; r < c.rows; ++r) {
    std::copy(packed.begin() + r * n32, packed.begin() + (r + 1) * n32, pb.begin() + r * stride);
  }
  std::vector<float> acc = d.acc0;
  AmxPvBf16({pb.data(), stride, c.rows, vp.data(), c.n, c.head_dim, acc.data(), d.acc_stride},
            c.backend);
  int64_t differ = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t e = 0; e < c.head_dim; ++e) {
      differ += Bits(acc[r * d.acc_stride + e]) != Bits(want[r * d.acc_stride + e]);
    }
  }
  EXPECT_EQ(differ, 0);
}

INSTANTIATE_TEST_SUITE_P(Grid, AmxProductTest, ::testing::ValuesIn(SampledGrid()),
                         [](const ::testing::TestParamInfo<ProductCase>& param_info) {
                           return CaseName(param_info.param);
                         });

// ---- Decode: S^T = K Q^T, K rows in page order (loaded in place where
// bf16 and whole 32-dim chunks) or scrambled (converted into scratch).
struct DecodeCase {
  int64_t g, n, head_dim;
  DType dtype;
  bool in_order;
  AmxBackend backend;
};

std::vector<DecodeCase> DecodeGrid() {
  const int64_t gs[] = {1, 3, 4, 8, 16, 17, 32};
  const int64_t keys[] = {1, 15, 16, 17, 33, 100, 256};
  const int64_t dims[] = {5, 32, 64, 80, 128, 256};
  const DType dtypes[] = {DType::kBF16, DType::kF8E4M3FN, DType::kBF16, DType::kF8E5M2,
                          DType::kBF16, DType::kI8};
  std::vector<DecodeCase> cases;
  for (AmxBackend backend : {AmxBackend::kHardware, AmxBackend::kEmulated}) {
    for (int h = 0; h < 6; ++h) {
      for (int k = 0; k < 7; ++k) {
        cases.push_back({gs[(3 * h + k) % 7], keys[k], dims[h], dtypes[(h + k) % 6],
                         (h + 2 * k) % 3 != 0, backend});
      }
    }
  }
  return cases;
}

std::string DecodeName(const DecodeCase& c) {
  return std::string(c.backend == AmxBackend::kHardware ? "Hardware" : "Emulated") + "_g" +
         std::to_string(c.g) + "_n" + std::to_string(c.n) + "_hd" +
         std::to_string(c.head_dim) + "_" + DtypeName(c.dtype) +
         (c.in_order ? "_paged" : "_scrambled");
}

class AmxDecodeTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(AmxDecodeTest, TransposedLogitsMatchF64) {
  const DecodeCase c = GetParam();
  std::string why;
  if (!CanRun(c.backend, &why)) GTEST_SKIP() << why;
  const CacheRows k = MakeRows(c.dtype, c.n, c.head_dim, 51, c.in_order);
  const QRows q = MakeQ(c.g, c.head_dim, 52);
  std::vector<uint16_t> qt(AmxPackedQtElems(c.g, c.head_dim));
  AmxPackQt(q.bits.data(), q.stride, c.g, c.head_dim, qt.data());
  std::vector<uint16_t> scratch(AmxDecodeScratchElems(c.head_dim));
  const int64_t st_stride = c.g + 3, n16 = RoundUp(c.n, 16);
  std::vector<float> st(static_cast<size_t>((n16 + 1) * st_stride), NanF32(0x44));
  AmxDecodeLogitsT({c.dtype, k.rows.data(), c.n, c.head_dim, qt.data(), c.g, st.data(),
                    st_stride, scratch.data()},
                   c.backend);
  int64_t bad = 0, touched = 0;
  for (int64_t i = 0; i <= n16; ++i) {
    for (int64_t j = 0; j < st_stride; ++j) {
      const float got = st[i * st_stride + j];
      if (i >= n16 || j >= c.g) {
        touched += Bits(got) != Bits(NanF32(0x44));
        continue;
      }
      if (i >= c.n) {
        bad += got != 0.0f;
        continue;
      }
      double want = 0, bound = 0;
      for (int64_t d = 0; d < c.head_dim; ++d) {
        const double prod = Bf16Value(q.bits[j * q.stride + d]) * k.values[i * c.head_dim + d];
        want += prod;
        bound += std::fabs(prod);
      }
      if (!(std::fabs(got - want) <= 1e-5 * bound + 1e-30)) {
        if (++bad <= 5) ADD_FAILURE() << "st[" << i << "][" << j << "] " << got << " want " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(touched, 0) << "st written outside [RoundUp(n, 16)][g]";
}

INSTANTIATE_TEST_SUITE_P(Grid, AmxDecodeTest, ::testing::ValuesIn(DecodeGrid()),
                         [](const ::testing::TestParamInfo<DecodeCase>& param_info) {
                           return DecodeName(param_info.param);
                         });

// ---- Four threads at once (each its own tile state) give the single
// thread's results bit for bit; a release in between changes nothing.
class AmxThreadsTest : public ::testing::TestWithParam<AmxBackend> {};

TEST_P(AmxThreadsTest, FourThreadsMatchOne) {
  const ProductCase c{77, 100, 80, DType::kBF16, GetParam()};
  std::string why;
  if (!CanRun(c.backend, &why)) GTEST_SKIP() << why;
  const CacheRows k = MakeRows(c.dtype, c.n, c.head_dim, 31);
  const CacheRows v = MakeRows(c.dtype, c.n, c.head_dim, 32);
  const QRows q = MakeQ(c.rows, c.head_dim, 33);
  const PvData d = MakePv(c, 34);
  const std::vector<float> s1 = RunLogits(c, q, k).s, acc1 = RunPv(c, d, v);
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int iter = 0; iter < 3; ++iter) {
        const std::vector<float> s = RunLogits(c, q, k).s;
        const std::vector<float> acc = RunPv(c, d, v);
        mismatches[t] += std::memcmp(s.data(), s1.data(), 4 * s.size()) != 0;
        mismatches[t] += std::memcmp(acc.data(), acc1.data(), 4 * acc.size()) != 0;
        if (c.backend == AmxBackend::kHardware && iter == 1) AmxReleaseTiles();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

INSTANTIATE_TEST_SUITE_P(Backends, AmxThreadsTest,
                         ::testing::Values(AmxBackend::kHardware, AmxBackend::kEmulated),
                         [](const ::testing::TestParamInfo<AmxBackend>& param_info) {
                           return std::string(param_info.param == AmxBackend::kHardware ? "Hardware"
                                                                                  : "Emulated");
                         });

// ---- A pool thread that ran tiles gives them back before it sleeps (the
// kernel layer's worker-idle hook): in the next ParallelFor, XINUSE's tile
// data bit (XGETBV with ECX = 1, bit 18) is clear on every thread.

bool XinuseReadable() {
  uint32_t eax, ebx, ecx, edx;
  __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(0xD), "c"(1));
  return (eax >> 2) & 1;
}

bool TileDataInUse() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(1));
  return (eax >> 18) & 1;
}

TEST(AmxPool, WorkersReleaseTilesBeforeTheySleep) {
  std::string why;
  if (!CanRun(AmxBackend::kHardware, &why)) GTEST_SKIP() << why;
  if (!XinuseReadable()) GTEST_SKIP() << "XGETBV with ECX = 1 (XINUSE) is not supported";
  const ProductCase c{16, 32, 64, DType::kBF16, AmxBackend::kHardware};
  const CacheRows k = MakeRows(c.dtype, c.n, c.head_dim, 51);
  const QRows q = MakeQ(c.rows, c.head_dim, 52);
  constexpr int kWorkers = 4;
  ThreadPool pool;
  // One task per thread: each waits until all have started.
  auto on_every_thread = [&](auto&& body) {
    std::atomic<int> started{0};
    pool.ParallelFor(kWorkers, kWorkers, [&](int64_t, int worker) {
      started.fetch_add(1);
      while (started.load() < kWorkers) std::this_thread::yield();
      body(worker);
    });
  };
  int in_use_after_product[kWorkers] = {}, in_use_next_call[kWorkers] = {};
  on_every_thread([&](int worker) {
    RunLogits(c, q, k);
    in_use_after_product[worker] = TileDataInUse();
  });
  on_every_thread([&](int worker) { in_use_next_call[worker] = TileDataInUse(); });
  for (int w = 0; w < kWorkers; ++w) {
    if (!in_use_after_product[w]) GTEST_SKIP() << "XINUSE does not show the tiles in use";
    EXPECT_EQ(in_use_next_call[w], 0) << "worker " << w;
  }
}

// The emulated tiles agree with the hardware's bit for bit where both run
// (same sums in the same order would be ideal; the hardware may add a
// pair's two products differently, so this allows the f32 rounding).
TEST(AmxEmulation, MatchesHardwareWhereBothRun) {
  if (!AmxSupport().usable) GTEST_SKIP() << AmxSupport().reason;
  const ProductCase hw{40, 70, 96, DType::kF8E4M3FN, AmxBackend::kHardware};
  ProductCase emu = hw;
  emu.backend = AmxBackend::kEmulated;
  const CacheRows k = MakeRows(hw.dtype, hw.n, hw.head_dim, 41);
  const QRows q = MakeQ(hw.rows, hw.head_dim, 42);
  const std::vector<float> a = RunLogits(hw, q, k).s, b = RunLogits(emu, q, k).s;
  int64_t far = 0;
  for (size_t e = 0; e < a.size(); ++e) {
    if (std::isnan(a[e]) || std::isnan(b[e])) continue;
    far += std::fabs(a[e] - b[e]) > 1e-5f * (std::fabs(a[e]) + 1.0f);
  }
  EXPECT_EQ(far, 0);
}

#endif  // defined(__x86_64__)

}  // namespace
}  // namespace rpa::internal
