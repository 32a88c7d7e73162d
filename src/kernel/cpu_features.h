// What this CPU and operating system let the kernel run, detected once per
// process (CPUID, XGETBV); the one place rpa asks the hardware.
//
// Tests and benchmarks reach every dispatch path on one machine by hiding
// features for a scope (ScopedCpuFeatureMask): the dispatch then chooses as
// it would on a CPU without them.
#ifndef RPA_SRC_KERNEL_CPU_FEATURES_H_
#define RPA_SRC_KERNEL_CPU_FEATURES_H_

#include <string>

#include "rpa/kernels.h"

namespace rpa::internal {

struct CpuFeatures {
  // AVX-512 F, BW and VL with the opmask and zmm state enabled by the OS.
  bool avx512bw = false;
  // AVX512-FP16 arithmetic (implies avx512bw here).
  bool avx512fp16 = false;
  // AVX-512 BF16 (vcvtne2ps2bf16, vdpbf16ps; implies avx512bw here).
  bool avx512bf16 = false;
  // vdpbf16ps issues as often as the f32 FMA (twice its flops): AMD's
  // AVX-512 BF16 (Zen 4 measured: 235 vs 118 GFLOP/s per core); on the
  // Intel CPUs measured it issues at half the FMA's rate.
  bool fast_bf16_dot = false;
  // Intel AMX bf16 tiles: CPUID amx-tile and amx-bf16 (with AVX-512 BF16),
  // tile state enabled in XCR0, and Linux's permission to use it granted
  // to this process (one arch_prctl(ARCH_REQ_XCOMP_PERM) on detection).
  bool amx_bf16 = false;
  // Tests only: the AMX kernel's scalar tile model stands in for the tiles
  // (testing/amx_emulation.h), so its whole path runs where AMX is absent.
  bool amx_emulated = false;
  // RPA_AMX=1 in the environment: the AMX kernels are dispatched only when
  // asked for until they are measured on AMX hardware.
  bool amx_opted_in = false;

  // The features both masks have.
  CpuFeatures operator&(const CpuFeatures& o) const {
    return {avx512bw && o.avx512bw,         avx512fp16 && o.avx512fp16,
            avx512bf16 && o.avx512bf16,     fast_bf16_dot && o.fast_bf16_dot,
            amx_bf16 && o.amx_bf16,         amx_emulated && o.amx_emulated,
            amx_opted_in && o.amx_opted_in};
  }
  // E.g. "avx512bw avx512fp16 avx512bf16", or "none".
  std::string ToString() const;
};

// The features the hardware and OS offer (detected on the first call).
const CpuFeatures& DetectedCpuFeatures();

// Which CPU this is (rpa::CpuInfo), detected once.
const CpuInfo& ThisCpu();

// Why amx_bf16 is or is not set: "AMX bf16 tiles usable", or which step
// failed ("CPU lacks amx-bf16, amx-tile", "OS does not enable tile state in
// XCR0", "arch_prctl(ARCH_REQ_XCOMP_PERM) failed: ...").
const std::string& AmxDetection();

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

// Tests only (testing/amx_emulation.h's ScopedAmxEmulation): whether this
// thread's UsableCpuFeatures report the AMX tile model (amx_bf16 and
// amx_emulated, where the CPU has AVX-512 BF16, which the model's glue
// needs); returns the previous setting.
bool SetAmxEmulationOnThisThread(bool on);

// A mask that hides every feature: the portable Highway paths only.
inline constexpr CpuFeatures kNoCpuFeatures{};
// A mask that hides nothing.
inline constexpr CpuFeatures kAllCpuFeatures{true, true, true, true, true, true, true};

}  // namespace rpa::internal

#endif  // RPA_SRC_KERNEL_CPU_FEATURES_H_
