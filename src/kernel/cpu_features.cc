#include "kernel/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define RPA_HAVE_X86 1
#else
#define RPA_HAVE_X86 0
#endif

namespace rpa::internal {
namespace {

#if RPA_HAVE_X86
CpuFeatures Detect() {
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
  return f;
}
#else
CpuFeatures Detect() { return {}; }
#endif

thread_local CpuFeatures t_allowed = kAllCpuFeatures;

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
  return s.empty() ? "none" : s;
}

const CpuFeatures& DetectedCpuFeatures() {
  static const CpuFeatures detected = Detect();
  return detected;
}

CpuFeatures UsableCpuFeatures() { return DetectedCpuFeatures() & t_allowed; }

ScopedCpuFeatureMask::ScopedCpuFeatureMask(const CpuFeatures& allowed) : saved_(t_allowed) {
  t_allowed = t_allowed & allowed;
}

ScopedCpuFeatureMask::~ScopedCpuFeatureMask() { t_allowed = saved_; }

}  // namespace rpa::internal
