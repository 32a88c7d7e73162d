// The AMX prefill kernel (amx_prefill.cc). x86-64 only.
#ifndef RPA_SRC_KERNEL_AMX_PREFILL_H_
#define RPA_SRC_KERNEL_AMX_PREFILL_H_

#include "kernel/tile_kernel.h"

#if defined(__x86_64__)
namespace rpa::internal {

// Products on Intel AMX bf16 tiles for bf16 q over K/V of kv_dtype (bf16,
// fp8 or int8; null for any other); q in kBf16, accumulators kNatural.
// Needs CpuFeatures::amx_bf16.
const ProductKernel* AmxPrefill(DType kv_dtype);
// The same tile programs on the scalar tile model (amx.h's kEmulated
// backend): what tests run where the CPU has no AMX.
const ProductKernel* AmxPrefillEmulated(DType kv_dtype);

}  // namespace rpa::internal
#endif  // __x86_64__

#endif  // RPA_SRC_KERNEL_AMX_PREFILL_H_
