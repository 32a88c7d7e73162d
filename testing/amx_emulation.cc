#include "testing/amx_emulation.h"

#include "kernel/cpu_features.h"

#if defined(__x86_64__)
#include "kernel/amx_prefill.h"
#include "kernel/kernel_records.h"
#include "mla/mla_amx.h"
#endif

namespace rpa::testing {

#if defined(__x86_64__)

void AmxLogits(const internal::AmxLogitsArgs& args, AmxBackend backend) {
  if (backend == AmxBackend::kHardware) {
    internal::AmxLogits(args);
  } else {
    internal::amx::LogitsProgram<EmuTiles>(args);
  }
}

void AmxPvBf16(const internal::AmxPvBf16Args& args, AmxBackend backend) {
  if (backend == AmxBackend::kHardware) {
    internal::AmxPvBf16(args);
  } else {
    internal::amx::PvProgram<EmuTiles>(args);
  }
}

namespace {

// The AMX prefill kernel's tile unit: the model.
struct EmulatedTiles {
  static constexpr const char* kName = "amx_prefill (emulated)";
  static void Logits(const internal::AmxLogitsArgs& args) {
    internal::amx::LogitsProgram<EmuTiles>(args);
  }
  static void PvBf16(const internal::AmxPvBf16Args& args) {
    internal::amx::PvProgram<EmuTiles>(args);
  }
};

// mla_amx's tile unit: the same model under the MLA kernel's name.
struct EmulatedMlaTiles : EmulatedTiles {
  static constexpr const char* kName = "mla_amx (emulated)";
};

// First in the list, before avx512_bf16_packed; the hardware's amx_prefill
// needs the tiles not emulated, so the two never meet one call.
const internal::KernelRecord kEmulatedRecord = {
    "amx_prefill (emulated)", "testing/amx_emulation.cc",
    internal::AmxPrefillNeeds([](const internal::CpuFeatures& f, DType) { return f.amx_emulated; }),
    internal::AmxPrefillOn<EmulatedTiles>};

}  // namespace

#endif  // __x86_64__

ScopedAmxEmulation::ScopedAmxEmulation() : saved_(internal::SetAmxEmulationOnThisThread(true)) {
#if defined(__x86_64__)
  internal::InstallTestKernelRecord(kEmulatedRecord);
  internal::InstallTestMlaAmxKernel(internal::mla_amx::kKernelOn<EmulatedMlaTiles>);
#endif
}

ScopedAmxEmulation::~ScopedAmxEmulation() { internal::SetAmxEmulationOnThisThread(saved_); }

}  // namespace rpa::testing
