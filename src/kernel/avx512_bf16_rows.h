// The AVX-512 BF16 pair kernels for decode and the middle class
// (avx512_bf16_rows.cc): both products by vdpbf16ps straight from the
// cache's rows. x86-64 only.
#ifndef RPA_SRC_KERNEL_AVX512_BF16_ROWS_H_
#define RPA_SRC_KERNEL_AVX512_BF16_ROWS_H_

#include "kernel/tile_kernel.h"

#if defined(__x86_64__)
namespace rpa::internal {

// Unfused products over K/V of kv_dtype (bf16, e4m3fn, e5m2 or int8; null for any
// other) with bf16 q (kBf16); accumulators kPairInterleaved. Needs
// CpuFeatures::avx512bf16.
const ProductKernel* Avx512Bf16Rows(DType kv_dtype);
// The fused decode tile of the same arithmetic (min_rows 3).
const FusedTileKernel* Avx512Bf16Decode(DType kv_dtype);

}  // namespace rpa::internal
#endif  // __x86_64__

#endif  // RPA_SRC_KERNEL_AVX512_BF16_ROWS_H_
