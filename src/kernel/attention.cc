// Compiles attention-inl.h once per Highway target (the set capped by the
// RPA_HWY_TARGETS CMake option) and dispatches to the best one the CPU has.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernel/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "kernel/attention-inl.h"

#if HWY_ONCE
namespace rpa::internal {

HWY_EXPORT(RunTask);

void RunKernelTask(const AttentionProblem& problem, const KernelTask& task, int64_t kv_block,
                   KernelPath path, const WorkerScratch& scratch, float* partials) {
  HWY_DYNAMIC_DISPATCH(RunTask)(problem, task, kv_block, path, scratch, partials);
}

}  // namespace rpa::internal
#endif  // HWY_ONCE
