// What this CPU and operating system let the kernel run, detected once per
// process (CPUID, XGETBV); the one place rpa asks the hardware.
//
// Tests and benchmarks reach every dispatch path on one machine by hiding
// features for a scope (ScopedCpuFeatureMask): the dispatch then chooses as
// it would on a CPU without them.
#ifndef RPA_SRC_KERNEL_CPU_FEATURES_H_
#define RPA_SRC_KERNEL_CPU_FEATURES_H_

#include <string>

namespace rpa::internal {

struct CpuFeatures {
  // AVX-512 F, BW and VL with the opmask and zmm state enabled by the OS.
  bool avx512bw = false;
  // AVX512-FP16 arithmetic (implies avx512bw here).
  bool avx512fp16 = false;
  // AVX-512 BF16 (vcvtne2ps2bf16, vdpbf16ps; implies avx512bw here).
  bool avx512bf16 = false;

  // The features both masks have.
  CpuFeatures operator&(const CpuFeatures& o) const {
    return {avx512bw && o.avx512bw, avx512fp16 && o.avx512fp16, avx512bf16 && o.avx512bf16};
  }
  // E.g. "avx512bw avx512fp16 avx512bf16", or "none".
  std::string ToString() const;
};

// The features the hardware and OS offer (detected on the first call).
const CpuFeatures& DetectedCpuFeatures();

// The features dispatch may use on this thread: the detected ones less any
// hidden by a ScopedCpuFeatureMask on this thread. The choice is made once
// per call on the calling thread, so a mask never reaches another caller.
CpuFeatures UsableCpuFeatures();

// Hides features for this object's lifetime on the constructing thread;
// nested masks combine, and each destructor restores what it found.
class ScopedCpuFeatureMask {
 public:
  explicit ScopedCpuFeatureMask(const CpuFeatures& allowed);
  ~ScopedCpuFeatureMask();
  ScopedCpuFeatureMask(const ScopedCpuFeatureMask&) = delete;
  ScopedCpuFeatureMask& operator=(const ScopedCpuFeatureMask&) = delete;

 private:
  CpuFeatures saved_;
};

// A mask that hides every feature: the portable Highway paths only.
inline constexpr CpuFeatures kNoCpuFeatures{};
// A mask that hides nothing.
inline constexpr CpuFeatures kAllCpuFeatures{true, true, true};

}  // namespace rpa::internal

#endif  // RPA_SRC_KERNEL_CPU_FEATURES_H_
