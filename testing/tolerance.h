// docs/contract.md §1's tolerance table, written once for the C++ tests, the fuzzers and
// `rpa demo` (the Python tests' copy is TOLERANCE in
// tests/python/rpa_testing.py): how far the fast path may be from the
// reference on unit-normal inputs, and what rounding the output to q's dtype
// adds on top.
#ifndef RPA_TESTING_TOLERANCE_H_
#define RPA_TESTING_TOLERANCE_H_

#include <cmath>

#include "rpa/dtype.h"

namespace rpa::testing {

// Max abs error of the fast path against the reference, on unit-normal
// inputs, by K/V dtype (docs/contract.md §1): f32 1e-5 (at sm_scale = head_dim^-0.5;
// the contract allows 1e-4 at sm_scale = 1), bf16 and f16 1e-2, the 8-bit formats
// (fp8 e4m3fn, fp8 e5m2, int8) 5e-2.
inline double KvTolerance(DType kv_dtype) {
  switch (kv_dtype) {
    case DType::kF32: return 1e-5;
    case DType::kBF16: case DType::kF16: return 1e-2;
    default: return 5e-2;
  }
}

// One unit in the last place of `dtype` at magnitude [1, 2), as a fraction
// of the value: bf16 2^-7, f16 2^-10, f32 2^-23.
inline double OutputUlp(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return 0x1p-7;
    case DType::kF16: return 0x1p-10;
    default: return 0x1p-23;
  }
}

// What rounding an output of magnitude |reference| to q's dtype adds to the
// bound: one ulp of it for a 16-bit output (the fast path and the reference
// round slightly different f32 values, which may land on neighbours); nothing
// for an f32 output, whose rounding (2^-24 of the value) the f32 bound
// already covers.
inline double OutputRounding(DType q_dtype, double reference) {
  return q_dtype == DType::kF32 ? 0.0 : OutputUlp(q_dtype) * std::fabs(reference);
}

// The bound on one output element whose reference value is `reference`.
inline double Tolerance(DType q_dtype, DType kv_dtype, double reference) {
  return KvTolerance(kv_dtype) + OutputRounding(q_dtype, reference);
}

// got like the reference's want where the reference is not finite (a case
// that injects NaN or infinities): NaN for NaN, the same infinity, else
// within tol.
inline bool LikeReference(double got, double want, double tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= tol;
}

}  // namespace rpa::testing

#endif  // RPA_TESTING_TOLERANCE_H_
