// The 8-bit (float and int8) decode tile in f16 arithmetic (avx512_fp16_decode.cc).
// x86-64 only.
#ifndef RPA_SRC_KERNEL_AVX512_FP16_DECODE_H_
#define RPA_SRC_KERNEL_AVX512_FP16_DECODE_H_

#include "kernel/tile_kernel.h"

#if defined(__x86_64__)
namespace rpa::internal {

// A fused decode tile over K/V of kv_dtype (e4m3fn, e5m2 or int8; null for
// any other), q in kHalf (its prepare_q stores an f32 row as f16 scaled by a
// power of 2 and returns the factor that undoes it), accumulators kEvenOdd.
// Needs CpuFeatures::avx512fp16.
const FusedTileKernel* Avx512Fp16Decode(DType kv_dtype);

}  // namespace rpa::internal
#endif  // __x86_64__

#endif  // RPA_SRC_KERNEL_AVX512_FP16_DECODE_H_
