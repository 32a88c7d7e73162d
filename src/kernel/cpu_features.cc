#include "kernel/cpu_features.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <utility>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#define RPA_HAVE_X86 1
#else
#define RPA_HAVE_X86 0
#endif

namespace rpa::internal {
namespace {

#if RPA_HAVE_X86
constexpr long kArchGetXcompPerm = 0x1022;
constexpr long kArchReqXcompPerm = 0x1023;
constexpr long kXfeatureXtiledata = 18;

// AMX: what the CPU has, what the OS enables, what Linux grants; "" when
// usable, else the step that failed.
std::string AmxFailure(bool avx512bf16) {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return "CPU lacks CPUID leaf 7 (no AMX)";
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  std::string lacks;
  auto add = [&lacks](bool has, const char* name) {
    if (!has) lacks += (lacks.empty() ? "" : ", ") + std::string(name);
  };
  add((edx >> 22) & 1, "amx-bf16");
  add((edx >> 24) & 1, "amx-tile");
  add(avx512bf16, "avx512-bf16 (with OS zmm state)");
  if (!lacks.empty()) return "CPU lacks " + lacks;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if (((xcr0_lo >> 17) & 3) != 3) return "OS does not enable tile state in XCR0";
  // Linux (5.16+) hands out the 8 KiB tile data state only on request;
  // without it the first tile instruction raises SIGILL.
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    return std::string("arch_prctl(ARCH_REQ_XCOMP_PERM) failed: ") + std::strerror(errno);
  }
  unsigned long long perm = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &perm) != 0 ||
      !((perm >> kXfeatureXtiledata) & 1)) {
    return "arch_prctl(ARCH_GET_XCOMP_PERM) does not show the tile data permission";
  }
  return "";
}

// CPUID leaf 0's vendor string ("AuthenticAMD", "GenuineIntel").
std::string CpuidVendor() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __cpuid(0, eax, ebx, ecx, edx);
  char vendor[13] = {};  // EBX, EDX, ECX spell it.
  std::memcpy(vendor, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  return vendor;
}

bool IsAmd() { return CpuidVendor() == "AuthenticAMD"; }

struct FamilyModel {
  int family = 0;
  int model = 0;
};

// CPUID leaf 1's family and model as both vendors number them: the extended
// family added where the base family is 0xF, the extended model prefixed
// where it is 0x6 or 0xF (Zen 4: family 25 = 0x19, Zen 5: 26 = 0x1A).
FamilyModel CpuidFamilyModel() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __cpuid(1, eax, ebx, ecx, edx);
  const int base_family = static_cast<int>((eax >> 8) & 0xF);
  const int base_model = static_cast<int>((eax >> 4) & 0xF);
  FamilyModel fm;
  fm.family = base_family + (base_family == 0xF ? static_cast<int>((eax >> 20) & 0xFF) : 0);
  fm.model = base_model + (base_family == 0x6 || base_family == 0xF
                               ? static_cast<int>((eax >> 16) & 0xF) << 4
                               : 0);
  return fm;
}

// Zen 5 (AMD family 0x1A) and later: decode's next-tile prefetches in address
// order into L1 (CpuFeatures::prefetch_in_address_order). Measured faster on
// Zen 5 only: on Zen 4 (family 0x19) that order made decode 1.6x slower
// than each kv head's own rows into L2 (docs/kernel_log.md, 2026-12-07
// sixth session), on Intel Sapphire Rapids 1.25-1.33x.
constexpr int kAddressOrderAmdFamily = 0x1A;

// The AVX-512 features (and the vendor rule for the bf16 dot product); none
// where the CPU or the OS (XCR0) lacks the zmm state.
CpuFeatures DetectAvx512() {
  CpuFeatures f;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(1, 0, eax, ebx, ecx, edx);
  if (!((ecx >> 27) & 1)) return f;  // OSXSAVE: XGETBV usable.
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  // XMM, YMM, opmask, ZMM_Hi256 and Hi16_ZMM state enabled by the OS.
  if ((xcr0_lo & 0xE6) != 0xE6) return f;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool avx512f = (ebx >> 16) & 1, avx512bw = (ebx >> 30) & 1, avx512vl = (ebx >> 31) & 1;
  f.avx512bw = avx512f && avx512bw && avx512vl;
  f.avx512fp16 = f.avx512bw && ((edx >> 23) & 1);
  __cpuid_count(7, 1, eax, ebx, ecx, edx);
  f.avx512bf16 = f.avx512bw && ((eax >> 5) & 1);
  f.fast_bf16_dot = f.avx512bf16 && IsAmd();
  return f;
}

// Every feature, and in *amx_reason why AMX is usable or not (a CPU without
// AVX-512 gets a reason too: AmxFailure names what it lacks).
CpuFeatures Detect(std::string* amx_reason) {
  CpuFeatures f = DetectAvx512();
  f.prefetch_in_address_order = IsAmd() && CpuidFamilyModel().family >= kAddressOrderAmdFamily;
  // RPA_AMX=0: the user turns the AMX kernels off (to compare, or to keep
  // this process's threads free of the 8 KiB tile state); nothing is
  // requested from the OS then.
  const char* setting = std::getenv("RPA_AMX");
  if (setting != nullptr && std::strcmp(setting, "0") == 0) {
    *amx_reason = "turned off by RPA_AMX=0";
    return f;
  }
  const std::string amx = AmxFailure(f.avx512bf16);
  f.amx_bf16 = amx.empty();
  *amx_reason = f.amx_bf16 ? "AMX bf16 tiles usable" : amx;
  return f;
}
#else
CpuFeatures Detect(std::string* amx_reason) {
  *amx_reason = "not x86-64";
  return {};
}
#endif

struct Detection {
  std::string amx_reason;
  CpuFeatures features;
};

const Detection& Detected() {
  static const Detection d = [] {
    Detection out;
    out.features = Detect(&out.amx_reason);
    return out;
  }();
  return d;
}

thread_local CpuFeatures t_allowed = kAllCpuFeatures;
thread_local bool t_amx_emulated = false;
// ScopedCpuRules: the rules this thread's dispatch follows; none: the CPU's own.
thread_local std::optional<CpuRules> t_rules;

}  // namespace

std::string CpuFeatures::ToString() const {
  std::string s;
  auto add = [&](bool has, const char* name) {
    if (!has) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx512bw, "avx512bw");
  add(avx512fp16, "avx512fp16");
  add(avx512bf16, "avx512bf16");
  add(fast_bf16_dot, "fast-bf16-dot");
  add(amx_bf16 && !amx_emulated, "amx-bf16");
  add(amx_emulated, "amx-bf16 (emulated)");
  return s.empty() ? "none" : s;
}

const CpuFeatures& DetectedCpuFeatures() { return Detected().features; }

namespace {

// /proc/cpuinfo's "model name", or "unknown".
std::string ProcModelName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t first = line.find_first_not_of(' ', colon + 1);
    return first == std::string::npos ? std::string("unknown") : line.substr(first);
  }
  return "unknown";
}

CpuInfo Identify() {
  CpuInfo id;
  id.model_name = ProcModelName();
  id.features = DetectedCpuFeatures().ToString();
#if RPA_HAVE_X86
  id.vendor = CpuidVendor();
  const FamilyModel fm = CpuidFamilyModel();
  id.family = fm.family;
  id.model = fm.model;
#endif
  return id;
}

}  // namespace

const CpuInfo& ThisCpu() {
  static const CpuInfo id = Identify();
  return id;
}

const std::string& AmxDetection() { return Detected().amx_reason; }

CpuFeatures UsableCpuFeatures() {
  CpuFeatures f = DetectedCpuFeatures();
  if (t_amx_emulated && f.avx512bf16) f.amx_bf16 = f.amx_emulated = true;
  if (t_rules.has_value()) {
    f.fast_bf16_dot = *t_rules != CpuRules::kIntel && f.avx512bf16;
    f.prefetch_in_address_order = *t_rules == CpuRules::kZen5;
  }
  f = f & t_allowed;
  // A mask that hides a feature hides what builds on it (so no mask can
  // leave a kernel dispatched without its instructions).
  f.avx512fp16 = f.avx512fp16 && f.avx512bw;
  f.avx512bf16 = f.avx512bf16 && f.avx512bw;
  f.fast_bf16_dot = f.fast_bf16_dot && f.avx512bf16;
  f.amx_bf16 = f.amx_bf16 && f.avx512bf16;
  f.amx_emulated = f.amx_emulated && f.amx_bf16;
  return f;
}

bool SetAmxEmulationOnThisThread(bool on) { return std::exchange(t_amx_emulated, on); }

ScopedCpuFeatureMask::ScopedCpuFeatureMask(const CpuFeatures& allowed) : saved_(t_allowed) {
  t_allowed = t_allowed & allowed;
}

ScopedCpuFeatureMask::~ScopedCpuFeatureMask() { t_allowed = saved_; }

ScopedCpuRules::ScopedCpuRules(CpuRules rules) : saved_(std::exchange(t_rules, rules)) {}

ScopedCpuRules::~ScopedCpuRules() { t_rules = saved_; }

}  // namespace rpa::internal
