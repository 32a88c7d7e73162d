// Hides AMX from the kernel dispatch: `rpa bench` times the path a CPU
// without AMX would run beside the AMX one. Not part of librpa.
#ifndef RPA_TESTING_WITHOUT_AMX_H_
#define RPA_TESTING_WITHOUT_AMX_H_

#include "kernel/cpu_features.h"

namespace rpa::testing {

// For this object's lifetime on the constructing thread, dispatch chooses
// as on the same CPU without AMX (the calls made there choose their kernels
// on this thread, so no other caller is affected).
class ScopedWithoutAmx {
 public:
  ScopedWithoutAmx() : mask_(AllButAmx()) {}

 private:
  static internal::CpuFeatures AllButAmx() {
    internal::CpuFeatures features = internal::kAllCpuFeatures;
    features.amx_bf16 = false;
    return features;
  }
  internal::ScopedCpuFeatureMask mask_;
};

}  // namespace rpa::testing

#endif  // RPA_TESTING_WITHOUT_AMX_H_
