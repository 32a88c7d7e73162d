// What this CPU and operating system let the kernel run, detected once per
// process (CPUID, XGETBV); the one place rpa asks the hardware.
//
// Tests and benchmarks reach every dispatch path on one machine by hiding
// features for a scope (ScopedCpuFeatureMask): the dispatch then chooses as
// it would on a CPU without them.
#ifndef RPA_SRC_KERNEL_CPU_FEATURES_H_
#define RPA_SRC_KERNEL_CPU_FEATURES_H_

#include <cstdint>
#include <optional>
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
  // to this process (one arch_prctl(ARCH_REQ_XCOMP_PERM) on detection),
  // unless RPA_AMX=0 turns it off.
  bool amx_bf16 = false;
  // Decode's next-tile prefetches go in address order into L1: a token's
  // rows of every kv head together, dealt out to the passes
  // (next_tile_rows.h), where the hardware then streams them (one Zen 5
  // core read 27-28 GB/s that way against 16-18 per head). Without it each
  // kv head's pass prefetches its own rows into L2: on Zen 4 that order is
  // the faster (decode 1.6x, docs/kernel_log.md 2026-12-07 sixth session),
  // on Intel Sapphire Rapids too (1.25-1.33x, 2026-12-06). A CPU rule, as
  // fast_bf16_dot's: AMD family 0x1A (Zen 5) and later.
  bool prefetch_in_address_order = false;
  // Tests only: the AMX kernel's scalar tile model stands in for the tiles
  // (testing/amx_emulation.h), so its whole path runs where AMX is absent.
  bool amx_emulated = false;

  // The features both masks have.
  CpuFeatures operator&(const CpuFeatures& o) const {
    return {avx512bw && o.avx512bw,
            avx512fp16 && o.avx512fp16,
            avx512bf16 && o.avx512bf16,
            fast_bf16_dot && o.fast_bf16_dot,
            amx_bf16 && o.amx_bf16,
            prefetch_in_address_order && o.prefetch_in_address_order,
            amx_emulated && o.amx_emulated};
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

// The kinds of CPU whose rules (fast_bf16_dot, prefetch_in_address_order)
// differ: Intel's (neither), Zen 4's (the bf16 dot product), Zen 5's (both).
enum class CpuRules : uint8_t { kIntel, kZen4, kZen5 };

// Tests only: the CPU rules as on `rules`' kind of CPU, for this object's
// lifetime on the constructing thread. Both rules choose between
// instructions this CPU has (fast_bf16_dot still needs AVX-512 BF16), for
// speed, so the paths they pick run on any machine; a mask still hides
// them.
class ScopedCpuRules {
 public:
  explicit ScopedCpuRules(CpuRules rules);
  ~ScopedCpuRules();
  ScopedCpuRules(const ScopedCpuRules&) = delete;
  ScopedCpuRules& operator=(const ScopedCpuRules&) = delete;

 private:
  std::optional<CpuRules> saved_;
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
