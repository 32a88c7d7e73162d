// The one dispatch point: which tile kernels a call runs, chosen once per
// call from (K/V dtype, rows per kv head, the options that matter, CPU
// features), and recorded in the plan.
//
// The table, for every K/V dtype, task class and kind of CPU, is
// docs/dispatch.md: DispatchTable() below writes it from the kernel records
// (kernel_records.cc) and KernelDispatchTest.DocsTableIsTheRecords fails when
// the committed copy differs. "fast dot": vdpbf16ps issues as often as the
// f32 FMA (CpuFeatures::fast_bf16_dot, AMD's AVX-512 BF16); the bf16 kernels
// take bf16 q only (they take their operands exactly in bf16). With AMX
// (CpuFeatures::amx_bf16; RPA_AMX=0 turns it off), bf16 q and
// bf16/fp8/int8 K/V, the middle and prefill rows are amx_prefill (its
// scalar tile model, testing/amx_emulation.h, has a record only a test
// installs). Experimental, in no row: the AMX decode variant,
// PV from f32 weights and the hi + lo logits (testing/amx_experimental.h).
//
// "a > b" is a fused tile a, falling back to b on a tile it declines (or on
// a group of fewer rows than a's min_rows). The fused tiles run only without
// a soft cap and ALiBi, on tiles every row sees whole. Why: docs/kernel.md, Dispatch
// (vdpbf16ps pairs where they issue at the FMA's rate; the widening path
// where they issue at half of it; packing a tile once pays from 32 rows
// on; the f16 tile is the cheapest 8-bit decode where AVX512-FP16 exists).
#ifndef RPA_SRC_KERNEL_DISPATCH_H_
#define RPA_SRC_KERNEL_DISPATCH_H_

#include <cstdint>
#include <string>

#include "kernel/cpu_features.h"
#include "kernel/task.h"
#include "kernel/tile_kernel.h"
#include "problem.h"

namespace rpa::internal {

// The kernels of one class of tasks: fused tiles tried in order, then the
// products for the rows they leave.
struct TaskKernels {
  const FusedTileKernel* fused[2] = {nullptr, nullptr};
  const ProductKernel* products = nullptr;
  // "avx512fp16_decode > avx512_wide_decode > avx512_wide".
  std::string Describe() const;
};

struct KernelChoice {
  TaskKernels classes[kNumTaskClasses];
  // Where a task over several kv heads prefetches the next tile's rows
  // (CpuFeatures::prefetch_in_address_order, next_tile_rows.h).
  bool prefetch_in_address_order = false;
  const TaskKernels& For(TaskClass c) const { return classes[static_cast<int>(c)]; }
};

// The choice for this problem on a CPU with these features: for each class
// of task, the first of KernelRecords' products whose needs are met, and
// the fused tiles that agree with them (kernel_records.h).
KernelChoice ChooseKernels(const AttentionProblem& problem, const CpuFeatures& cpu);

// The dispatch table's rows for K/V of kv_dtype (without and with a soft
// cap) on this thread's usable CPU features, one line per class of task,
// after a line naming the features: what `rpa explain` and `rpa --version`
// print.
std::string DescribeDispatch(DType kv_dtype);

// The whole dispatch table as Markdown: a row per (q dtype, K/V dtype, task
// class), a column per kind of x86-64 CPU (the features that change the
// choice), each cell the kernels chosen (and, where it differs, with a soft
// cap). Computed from the records alone, whatever this CPU is: what
// docs/dispatch.md holds.
std::string DispatchTable();

}  // namespace rpa::internal

#endif  // RPA_SRC_KERNEL_DISPATCH_H_
