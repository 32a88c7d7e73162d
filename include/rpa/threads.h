// rpa's worker threads: how many a call uses when num_threads is not given,
// and which CPUs they run on (docs/kernel.md, "Threads").
//
// A call's workers are the calling thread (worker 0) and threads of one
// process-wide pool (workers 1, 2, ...). Without num_threads a call uses
// RPA_NUM_THREADS, else the smallest of: the CPUs in the process's affinity
// mask (taskset, cpusets), its cgroup CPU quota rounded up (cgroup v2
// cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us: `docker --cpus`,
// Kubernetes limits) and, when workers are bound, the number of CPUs bound.
#ifndef RPA_THREADS_H_
#define RPA_THREADS_H_

#include <string>
#include <vector>

#include "rpa/export.h"

namespace rpa {

// Pins the pool's workers, process-wide: worker w >= 1 runs on cpus[w]
// only. cpus[0] is worker 0's, the calling thread's, which rpa never moves
// (pin it there yourself if it should be: sched_setaffinity, taskset).
// Workers beyond the list keep the mask they started with; an empty list
// unpins every worker. Replaces RPA_CPU_BIND (same meaning, e.g.
// RPA_CPU_BIND=0,2-3, read at the first call). Takes effect at the next
// call that uses more than one thread.
// Throws rpa::Error (ErrorKind::kOption) for a CPU outside the process's
// affinity mask or listed twice; the binding is then unchanged.
RPA_EXPORT void SetCpuBinding(const std::vector<int>& cpus);

// The thread count a call without num_threads uses (see above).
RPA_EXPORT int DefaultNumThreads();

// Why DefaultNumThreads() is what it is and where the workers run, for
// logs: "2 CPUs (affinity mask 2, cgroup quota none), workers pinned to
// CPUs 0-1" (or "..., workers unpinned").
RPA_EXPORT std::string DescribeThreads();

}  // namespace rpa

#endif  // RPA_THREADS_H_
