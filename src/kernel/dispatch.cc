#include "kernel/dispatch.h"

#include "kernel/kernel.h"

#if defined(__x86_64__)
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
    // The fused tiles keep no soft cap (their exp has no tanh before it).
    if (problem.soft_cap == 0.0f) {
      int i = 0;
      if (fp8 && cpu.avx512fp16) decode.fused[i++] = &kAvx512Fp16Decode;
      decode.fused[i] = &kAvx512WideDecode;
    }
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
  problem.kv_dtype = kv_dtype;
  const KernelChoice plain = ChooseKernels(problem, cpu);
  problem.soft_cap = 30.0f;
  const KernelChoice capped = ChooseKernels(problem, cpu);
  std::string s = "cpu features: " + cpu.ToString() + "\n";
  for (int c = 0; c < kNumTaskClasses; ++c) {
    const std::string a = plain.classes[c].Describe(), b = capped.classes[c].Describe();
    s += std::string("  ") + ToString(static_cast<TaskClass>(c)) + ": " + a;
    if (a != b) s += " (soft cap: " + b + ")";
    s += "\n";
  }
  return s;
}

}  // namespace rpa::internal
