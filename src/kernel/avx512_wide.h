// The AVX-512 widening kernels (avx512_wide.cc): bf16, f16 and 8-bit float
// K/V widened to f32 in registers, f32 FMA. x86-64 only.
#ifndef RPA_SRC_KERNEL_AVX512_WIDE_H_
#define RPA_SRC_KERNEL_AVX512_WIDE_H_

#include "kernel/tile_kernel.h"

#if defined(__x86_64__)
namespace rpa::internal {

// Unfused products over K/V of kv_dtype (bf16, f16, e4m3fn or e5m2; null for
// any other), any q dtype (as f32); q in kF32EvenOdd, accumulators kEvenOdd.
// Needs CpuFeatures::avx512bw.
const ProductKernel* Avx512Wide(DType kv_dtype);
// The same products over 8-bit float K/V (e4m3fn, e5m2; null for any other)
// that convert each tile into bf16 scratch rows once, then run the bf16
// loops: for the middle class, whose 9-31 rows per kv head would otherwise
// convert the tile once per 4-row block.
const ProductKernel* Avx512WideFp8Scratch(DType kv_dtype);
// The fused decode tile of the same arithmetic (min_rows 3).
const FusedTileKernel* Avx512WideDecode(DType kv_dtype);

// 8-bit float rows as bf16, exactly (e4m3fn times 2^-8), converted by two
// vpermi2w table lookups per 32 codes: rows [tile.n] of `rows` written to
// scratch.kv_bf16 (scratch.dim_pad elements apart, zero padded to a
// multiple of 32); returns the rows there. Exposed for its exhaustive test.
KvRows Fp8RowsToBf16(DType dtype, const KvRows& rows, int64_t n, int64_t head_dim,
                     const TileScratch& scratch);

}  // namespace rpa::internal
#endif  // __x86_64__

#endif  // RPA_SRC_KERNEL_AVX512_WIDE_H_
