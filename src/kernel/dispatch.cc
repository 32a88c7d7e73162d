#include "kernel/dispatch.h"

#include <iterator>
#include <string>
#include <vector>

#include "hwy/targets.h"
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
  choice.prefetch_in_address_order = cpu.prefetch_in_address_order;
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

namespace {

// What dispatch chooses for calls of these dtypes on this CPU, without and
// with a soft cap (the fused tiles step aside for a soft cap or ALiBi).
struct ChoicePair {
  KernelChoice plain, capped;
  ChoicePair(DType q_dtype, DType kv_dtype, const CpuFeatures& cpu) {
    AttentionProblem problem;
    problem.q_dtype = q_dtype;
    problem.kv_dtype = kv_dtype;
    plain = ChooseKernels(problem, cpu);
    problem.soft_cap = 30.0f;
    capped = ChooseKernels(problem, cpu);
  }
  // "a > b", or "a > b (soft cap: b)" where the soft cap changes it.
  std::string Describe(int task_class) const {
    std::string a = plain.classes[task_class].Describe();
    const std::string b = capped.classes[task_class].Describe();
    if (a != b) a += " (soft cap: " + b + ")";
    return a;
  }
};

// The rows per kv head and tile (ClassOfRows) a class of task takes.
std::string ClassRows(TaskClass task_class) {
  switch (task_class) {
    case TaskClass::kDecode: return "<= " + std::to_string(kDecodeMaxRows);
    case TaskClass::kMiddle: return std::to_string(kDecodeMaxRows + 1) + "-" + std::to_string(kPackedMinRows - 1);
    case TaskClass::kPrefill: return ">= " + std::to_string(kPackedMinRows);
  }
  return "";
}

// The Highway target the highway_* kernels run on here: the best one both
// compiled in (RPA_HWY_TARGETS) and supported by this CPU, e.g. "AVX2".
std::string HighwayTarget() {
  const int64_t usable = HWY_TARGETS & hwy::SupportedTargets();
  return usable == 0 ? "EMU128" : hwy::TargetName(usable & -usable);  // Lower bits are better.
}

}  // namespace

std::string DescribeDispatch(DType kv_dtype) {
  const CpuFeatures cpu = UsableCpuFeatures();
  const ChoicePair choice(DType::kBF16, kv_dtype, cpu);
  std::string s = "cpu features: " + cpu.ToString() + "; highway: " + HighwayTarget() +
                  "; amx: " + AmxDetection() + "; next tile prefetched " +
                  (cpu.prefetch_in_address_order ? "in address order into L1"
                                                 : "per kv head into L2") +
                  "\n";
  for (int c = 0; c < kNumTaskClasses; ++c) {
    const auto task_class = static_cast<TaskClass>(c);
    s += std::string("  ") + ToString(task_class) + " (" + ClassRows(task_class) + " rows): " + choice.Describe(c);
    s += "\n";
  }
  return s;
}

std::string DispatchTable() {
  struct Column {
    const char* name;
    CpuFeatures cpu;
  };
  const Column columns[] = {
      {"AVX-512 BF16, fast dot (AMD Zen 4)",
       {.avx512bw = true, .avx512bf16 = true, .fast_bf16_dot = true}},
      {"AVX-512 BF16 + FP16 + AMX (Intel Sapphire Rapids)",
       {.avx512bw = true, .avx512fp16 = true, .avx512bf16 = true, .amx_bf16 = true}},
      {"the same without AMX (or RPA_AMX=0)",
       {.avx512bw = true, .avx512fp16 = true, .avx512bf16 = true}},
      {"AVX-512 BW", {.avx512bw = true}},
      {"no AVX-512 (Highway: AVX2, SSE4, NEON, ...)", {}},
  };
  const DType q_dtypes[] = {DType::kBF16, DType::kF32};
  const DType kv_dtypes[] = {DType::kBF16, DType::kF16,    DType::kF8E4M3FN,
                             DType::kF8E5M2, DType::kI8, DType::kF32};
  std::string s = "| q | K/V | rows per kv head |";
  for (const Column& column : columns) s += std::string(" ") + column.name + " |";
  s += "\n| --- | --- | --- |";
  for (size_t i = 0; i < std::size(columns); ++i) s += " --- |";
  s += "\n";
  for (DType q : q_dtypes) {
    for (DType kv : kv_dtypes) {
      std::vector<ChoicePair> choices;
      for (const Column& column : columns) choices.emplace_back(q, kv, column.cpu);
      for (int c = 0; c < kNumTaskClasses; ++c) {
        s += "| " + std::string(ToString(q)) + " | " + std::string(ToString(kv)) + " | " +
             ClassRows(static_cast<TaskClass>(c)) + " (" + ToString(static_cast<TaskClass>(c)) + ") |";
        for (const ChoicePair& choice : choices) {
          s += " ";
          s += choice.Describe(c);
          s += " |";
        }
        s += "\n";
      }
    }
  }
  return s;
}

}  // namespace rpa::internal

namespace rpa {

std::string DescribeKernels(DType kv_dtype) { return internal::DescribeDispatch(kv_dtype); }

const CpuInfo& ThisCpuInfo() { return internal::ThisCpu(); }

}  // namespace rpa
