// The AVX-512 BF16 kernel for the middle class with the query rows in the
// lanes of a vector (avx512_bf16_lanes.cc). x86-64 only.
#ifndef RPA_SRC_KERNEL_AVX512_BF16_LANES_H_
#define RPA_SRC_KERNEL_AVX512_BF16_LANES_H_

#include "kernel/tile_kernel.h"

#if defined(__x86_64__)
namespace rpa::internal {

// Unfused products over K/V of kv_dtype (bf16, e4m3fn, e5m2 or int8; null
// for any other) with bf16 q in kBf16PairLanes; accumulators
// kPairInterleaved. Needs CpuFeatures::avx512bf16.
const ProductKernel* Avx512Bf16Lanes(DType kv_dtype);
// The fused tile of the same arithmetic: up to 16 rows of one kv head, the
// softmax lane-wise between the products.
const FusedTileKernel* Avx512Bf16LanesTile(DType kv_dtype);

}  // namespace rpa::internal
#endif  // __x86_64__

#endif  // RPA_SRC_KERNEL_AVX512_BF16_LANES_H_
