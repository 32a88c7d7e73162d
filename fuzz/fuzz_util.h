// Shared pieces of the libFuzzer targets: a byte reader that turns the
// fuzzer's input into sizes, metadata and options; exactly sized buffers
// (so ASan sees any read past a view); seeded unit-normal tensor data; and
// the comparison against the reference.
#ifndef RPA_FUZZ_FUZZ_UTIL_H_
#define RPA_FUZZ_FUZZ_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "rpa/dtype.h"
#include "testing/tolerance.h"

namespace rpa::fuzz {

// Reports a finding and aborts, which libFuzzer records as a crash.
[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "\n*** rpa fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Reads the fuzzer's bytes in order; past the end every read is 0, so every
// input, however short, is a complete case.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint32_t U32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | Byte();
    return v;
  }
  uint64_t U64() { return (static_cast<uint64_t>(U32()) << 32) | U32(); }
  int64_t I64() { return static_cast<int64_t>(U64()); }
  double F64() {
    const uint64_t bits = U64();
    double d;
    std::memcpy(&d, &bits, sizeof(d));
    return d;
  }
  // Uniform-ish in [lo, hi] (hi - lo < 256).
  int64_t Small(int64_t lo, int64_t hi) { return lo + Byte() % (hi - lo + 1); }
  // In [0, 1].
  double Unit() { return (U32() >> 8) / static_cast<double>(1u << 24); }

  // A metadata integer: mostly in [lo, hi], sometimes the values an
  // untrusted scheduler gets wrong: -1, lo - 1, hi + 1, INT32_MAX,
  // INT32_MIN, INT32_MAX - 1 and raw 32-bit values.
  int32_t Meta(int64_t lo, int64_t hi) {
    const uint8_t b = Byte();
    if (b < 216) {
      if (hi < lo) return static_cast<int32_t>(lo);
      return static_cast<int32_t>(lo + b % (hi - lo + 1));
    }
    switch (b % 8) {
      case 0: return -1;
      case 1: return static_cast<int32_t>(lo - 1);
      case 2: return static_cast<int32_t>(hi + 1);
      case 3: return std::numeric_limits<int32_t>::max();
      case 4: return std::numeric_limits<int32_t>::min();
      case 5: return std::numeric_limits<int32_t>::max() - 1;
      case 6: return static_cast<int32_t>(U32());
      default: return static_cast<int32_t>(hi);
    }
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// An exactly sized buffer of `elements` elements of `dtype`, starting
// `offset` elements (or, for odd byte views, bytes) into its allocation.
struct Buffer {
  DType dtype = DType::kF32;
  std::vector<uint8_t> bytes;
  size_t byte_offset = 0;

  Buffer() = default;
  Buffer(DType dtype_in, int64_t elements, int64_t offset_elements)
      : dtype(dtype_in),
        bytes(static_cast<size_t>(offset_elements + elements) * SizeOf(dtype_in)),
        byte_offset(static_cast<size_t>(offset_elements) * SizeOf(dtype_in)) {
    if (bytes.empty()) bytes.resize(1);  // A non-null pointer for empty views.
  }
  void* Data() { return bytes.data() + byte_offset; }
  const void* Data() const { return bytes.data() + byte_offset; }
  void Fill(uint8_t pattern) { std::memset(bytes.data(), pattern, bytes.size()); }
  void Store(int64_t index, float value) { StoreFromF32(dtype, Data(), index, value); }
  float Load(int64_t index) const { return LoadAsF32(dtype, Data(), index); }
};

// Seeded unit-normal values: tolerances of docs/contract.md §1 hold for these.
class Normal {
 public:
  explicit Normal(uint64_t seed) : rng_(seed) {}
  float Next() { return dist_(rng_); }
  uint32_t Bits() { return static_cast<uint32_t>(rng_()); }

 private:
  std::mt19937_64 rng_;
  std::normal_distribution<float> dist_{0.0f, 1.0f};
};

using testing::KvTolerance;  // docs/contract.md §1's bound for the K/V dtype: the absolute tolerance.

// The relative tolerance the fuzzers add to KvTolerance (their values may
// have any scale): the output's rounding, two results a hair apart in f32
// rounding to neighbouring values (one ulp of a 16-bit output, two of an f32
// one), plus a tenth of the K/V dtype's bound.
inline double RelTolerance(DType q_dtype, DType kv_dtype) {
  const double ulps = q_dtype == DType::kF32 ? 2 : 1;
  return ulps * testing::OutputUlp(q_dtype) + KvTolerance(kv_dtype) / 10;
}

// Whether `got` matches `want` within abs_tol + rel_tol * |want|, NaN where
// the reference has NaN and infinities of the same sign.
inline bool Close(double got, double want, double abs_tol, double rel_tol) {
  return testing::LikeReference(got, want, abs_tol + rel_tol * std::fabs(want));
}

// Compares n elements of two buffers of one dtype; returns a description of
// the first mismatch, or "" if all match.
inline std::string CompareOutputs(const Buffer& got, const Buffer& want, int64_t n,
                                  double abs_tol, double rel_tol, const char* name) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = got.Load(i);
    const double w = want.Load(i);
    if (!Close(g, w, abs_tol, rel_tol)) {
      return std::string(name) + "[flat " + std::to_string(i) + "] = " + std::to_string(g) +
             ", reference " + std::to_string(w) + " (tolerance " + std::to_string(abs_tol) +
             " + " + std::to_string(rel_tol) + " * |ref|)";
    }
  }
  return "";
}

}  // namespace rpa::fuzz

#endif  // RPA_FUZZ_FUZZ_UTIL_H_
