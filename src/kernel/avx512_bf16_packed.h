// The AVX-512 BF16 packed prefill kernel (avx512_bf16_packed.cc). x86-64 only.
#ifndef RPA_SRC_KERNEL_AVX512_BF16_PACKED_H_
#define RPA_SRC_KERNEL_AVX512_BF16_PACKED_H_

#include "kernel/tile_kernel.h"

#if defined(__x86_64__)
namespace rpa::internal {

// Products by vdpbf16ps over K and V packed in bf16 pairs, for bf16 q over
// bf16, fp8 and int8 K/V; q in kBf16, accumulators kNatural. Needs
// CpuFeatures::avx512bf16.
extern const ProductKernel kAvx512Bf16Packed;

}  // namespace rpa::internal
#endif  // __x86_64__

#endif  // RPA_SRC_KERNEL_AVX512_BF16_PACKED_H_
