// The AVX-512 BF16 packed prefill kernel (avx512_bf16_packed.cc). x86-64 only.
#ifndef RPA_SRC_KERNEL_AVX512_BF16_PACKED_H_
#define RPA_SRC_KERNEL_AVX512_BF16_PACKED_H_

#include "kernel/tile_kernel.h"

#if defined(__x86_64__)
namespace rpa::internal {

// Products by vdpbf16ps over K and V packed in bf16 pairs, for bf16 q over
// K/V of kv_dtype (bf16, fp8 or int8; null for any other); q in kBf16,
// accumulators kNatural. Needs CpuFeatures::avx512bf16.
const ProductKernel* Avx512Bf16Packed(DType kv_dtype);

}  // namespace rpa::internal
#endif  // __x86_64__

#endif  // RPA_SRC_KERNEL_AVX512_BF16_PACKED_H_
