#include "kernel/dispatch.h"

#include "kernel/kernel_records.h"
#include "rpa/kernels.h"

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
  KernelChoice choice;
  for (int c = 0; c < kNumTaskClasses; ++c) {
    const TaskClass task_class = static_cast<TaskClass>(c);
    TaskKernels& k = choice.classes[c];
    // Each kernel as its instance for the call's K/V dtype: chosen here, once
    // per plan, so no tile function looks at the dtype (the Highway records
    // take every dtype: some products always meet the call).
    for (const KernelRecord& r : KernelRecords()) {
      if (r.products != nullptr && Meets(r, problem, task_class, cpu)) {
        k.products = r.products(problem.kv_dtype);
        break;
      }
    }
    // Fused tiles share the products' accumulators and scales: only those
    // that keep the same dimension order and e4m3fn unit join the chain.
    int fused = 0;
    for (const KernelRecord& r : KernelRecords()) {
      if (r.fused == nullptr || fused == 2 || !Meets(r, problem, task_class, cpu)) continue;
      const FusedTileKernel* tile = r.fused(problem.kv_dtype);  // Meets: one of its dtypes.
      if (tile->acc_order != k.products->acc_order ||
          tile->e4m3_scaled != k.products->e4m3_scaled) {
        continue;
      }
      k.fused[fused++] = tile;
    }
  }
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
                  (cpu.amx_bf16 && !cpu.amx_emulated && !cpu.amx_opted_in
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

const CpuInfo& ThisCpuInfo() { return internal::ThisCpu(); }

}  // namespace rpa
