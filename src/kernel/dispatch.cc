#include "kernel/dispatch.h"

#include <cstdlib>
#include <cstring>

#include "kernel/kernel.h"
#include "rpa/kernels.h"

#if defined(__x86_64__)
#include "kernel/amx_prefill.h"
#include "kernel/avx512_bf16_packed.h"
#include "kernel/avx512_fp16_decode.h"
#include "kernel/avx512_wide.h"
#endif

namespace rpa::internal {

const char* ToString(TaskClass c) {
  switch (c) {
    case TaskClass::kDecode: return "decode";
    case TaskClass::kMiddle: return "middle";
    case TaskClass::kPrefill: return "prefill";
  }
  return "?";
}

std::string TaskKernels::Describe() const {
  std::string s;
  for (const FusedTileKernel* f : fused) {
    if (f != nullptr) s += std::string(f->name) + " > ";
  }
  return s + (products != nullptr ? products->name : "none");
}

bool AmxOptedIn() {
  static const bool opted_in = [] {
    const char* v = std::getenv("RPA_AMX");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return opted_in;
}

KernelChoice ChooseKernels(const AttentionProblem& problem, const CpuFeatures& cpu) {
  const HighwayKernels highway = HighwayKernelsForCpu();
  KernelChoice choice;
  for (TaskKernels& k : choice.classes) k.products = highway.rows;
  choice.classes[static_cast<int>(TaskClass::kPrefill)].products = highway.packed;
#if defined(__x86_64__)
  const DType kv = problem.kv_dtype;
  const bool fp8 = kv == DType::kF8E4M3FN || kv == DType::kF8E5M2;
  if (cpu.avx512bw && (kv == DType::kBF16 || kv == DType::kF16 || fp8)) {
    TaskKernels& decode = choice.classes[static_cast<int>(TaskClass::kDecode)];
    decode.products = &kAvx512Wide;
    choice.classes[static_cast<int>(TaskClass::kMiddle)].products = &kAvx512Wide;
    // The fused tiles keep no soft cap (their exp has no tanh before it)
    // and add no ALiBi bias.
    if (problem.soft_cap == 0.0f && problem.alibi_slopes == nullptr) {
      int i = 0;
      if (fp8 && cpu.avx512fp16) decode.fused[i++] = &kAvx512Fp16Decode;
      decode.fused[i] = &kAvx512WideDecode;
    }
  }
  // The bf16 products take bf16 exactly: bf16 q, and K/V whose every value
  // is a bf16.
  const bool bf16_exact = problem.q_dtype == DType::kBF16 && (kv == DType::kBF16 || fp8 ||
                                                              kv == DType::kI8);
  if (cpu.fast_bf16_dot && bf16_exact) {
    choice.classes[static_cast<int>(TaskClass::kPrefill)].products = &kAvx512Bf16Packed;
  }
  if (cpu.amx_bf16 && bf16_exact && (cpu.amx_emulated || AmxOptedIn())) {
    choice.classes[static_cast<int>(TaskClass::kPrefill)].products =
        cpu.amx_emulated ? &kAmxPrefillEmulated : &kAmxPrefill;
  }
#else
  (void)problem;
  (void)cpu;
#endif
  return choice;
}

std::string DescribeDispatch(DType kv_dtype) {
  const CpuFeatures cpu = UsableCpuFeatures();
  AttentionProblem problem;
  problem.q_dtype = DType::kBF16;
  problem.kv_dtype = kv_dtype;
  const KernelChoice plain = ChooseKernels(problem, cpu);
  problem.soft_cap = 30.0f;
  const KernelChoice capped = ChooseKernels(problem, cpu);
  std::string s = "cpu features: " + cpu.ToString() + "; amx: " + AmxDetection() +
                  (cpu.amx_bf16 && !cpu.amx_emulated && !AmxOptedIn()
                       ? " (not dispatched: set RPA_AMX=1, not yet measured on AMX hardware)"
                       : "") +
                  "\n";
  for (int c = 0; c < kNumTaskClasses; ++c) {
    const std::string a = plain.classes[c].Describe(), b = capped.classes[c].Describe();
    s += std::string("  ") + ToString(static_cast<TaskClass>(c)) + ": " + a;
    if (a != b) s += " (soft cap: " + b + ")";
    s += "\n";
  }
  return s;
}

}  // namespace rpa::internal

namespace rpa {

std::string DescribeKernels(DType kv_dtype) { return internal::DescribeDispatch(kv_dtype); }

}  // namespace rpa
