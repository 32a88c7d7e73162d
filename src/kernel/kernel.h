// The kernel layer's entry for the run (compute.cc): one task through the
// kernels the call's dispatch chose. Layers below: task.h (the unit of
// work), scratch.h (per-worker buffers), dispatch.h (which kernels),
// tile_kernel.h (what a kernel is), one file per kernel.
#ifndef RPA_SRC_KERNEL_KERNEL_H_
#define RPA_SRC_KERNEL_KERNEL_H_

#include <cstdint>

#include "kernel/dispatch.h"
#include "kernel/scratch.h"
#include "kernel/task.h"
#include "problem.h"

namespace rpa::internal {

// What every task of one call shares.
struct KernelRun {
  const KernelChoice* kernels = nullptr;
  int64_t kv_block = 0;  // Keys per KV tile.
};

// Runs one task on the best compiled Highway target the CPU supports (or the
// one forced by hwy::SetSupportedTargetsForTest); writes its rows of
// problem.out, or its partial at partials + task.partial_offset.
void RunKernelTask(const AttentionProblem& problem, const KernelTask& task, const KernelRun& run,
                   const WorkerScratch& scratch, float* partials);

// The portable kernels of the same Highway target, for K/V of kv_dtype.
struct HighwayKernels {
  const ProductKernel* rows = nullptr;    // highway_rows-inl.h
  const ProductKernel* packed = nullptr;  // highway_packed-inl.h
};
HighwayKernels HighwayKernelsForCpu(DType kv_dtype);

}  // namespace rpa::internal

#endif  // RPA_SRC_KERNEL_KERNEL_H_
