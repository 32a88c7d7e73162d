// The AMX prefill kernel on the hardware's tiles (amx_prefill.h).
#include "kernel/amx_prefill.h"

#if defined(__x86_64__)
namespace rpa::internal {
namespace {

struct HardwareTiles : AmxHardwareTiles {
  static constexpr const char* kName = "amx_prefill";
};

}  // namespace

const ProductKernel* AmxPrefill(DType kv_dtype) { return AmxPrefillOn<HardwareTiles>(kv_dtype); }

}  // namespace rpa::internal

#endif  // __x86_64__
