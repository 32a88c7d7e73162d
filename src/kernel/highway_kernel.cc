// Compiles the Highway kernels and the task loop once per Highway target
// (the set capped by the RPA_HWY_TARGETS CMake option) and dispatches to
// the best one the CPU has.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernel/highway_kernel.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "kernel/highway_packed-inl.h"
#include "kernel/highway_rows-inl.h"
#include "kernel/task_loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace rpa::internal {
namespace HWY_NAMESPACE {

HighwayKernels GetHighwayKernels(DType kv_dtype) {
  return VisitKvElem(kv_dtype, [](auto tag) HWY_ATTR {
    using T = decltype(tag);
    return HighwayKernels{&kHighwayRows<T>, &kHighwayPacked<T>};
  });
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace rpa::internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rpa::internal {

HWY_EXPORT(RunTask);
HWY_EXPORT(GetHighwayKernels);

void RunKernelTask(const AttentionProblem& problem, const KernelTask& task, const KernelRun& run,
                   const WorkerScratch& scratch, float* partials) {
  HWY_DYNAMIC_DISPATCH(RunTask)(problem, task, run, scratch, partials);
}

HighwayKernels HighwayKernelsForCpu(DType kv_dtype) {
  return HWY_DYNAMIC_DISPATCH(GetHighwayKernels)(kv_dtype);
}

}  // namespace rpa::internal
#endif  // HWY_ONCE
