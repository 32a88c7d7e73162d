// How many CPUs this process may use: the smaller of its CPU affinity mask
// and its cgroup CPU quota. The pool's default size comes from it, so rpa in
// a container (`docker --cpus=2`, a Kubernetes CPU limit) or under `taskset`
// does not start more threads than it gets CPU time for; an oversubscribed
// pool loses more than it gains, since every ParallelFor waits for its
// slowest worker, and a descheduled worker is slow for a whole time slice.
#ifndef RPA_SRC_THREADS_CPU_BUDGET_H_
#define RPA_SRC_THREADS_CPU_BUDGET_H_

#include <optional>
#include <string>
#include <string_view>

namespace rpa::internal {

// Where the cgroup files are; tests point these at fixture files.
struct CgroupFiles {
  std::string self_cgroup = "/proc/self/cgroup";    // "id:controllers:path" lines.
  std::string mountinfo = "/proc/self/mountinfo";  // Where each hierarchy is mounted.
};

// cgroup v2 cpu.max ("quota period", quota "max": no limit) as whole CPUs,
// ceil(quota / period); none for no limit or text that is not such a line.
std::optional<int> ParseCpuMax(std::string_view text);
// cgroup v1 cpu.cfs_quota_us and cpu.cfs_period_us (quota -1: no limit),
// likewise.
std::optional<int> ParseCfsQuota(std::string_view quota, std::string_view period);

// The process's CPU quota in whole CPUs: the smallest limit on the cgroup
// path from the process's cgroup up to the hierarchy's root (a parent's
// limit binds its children too), over the v2 hierarchy and the v1 "cpu"
// controller, whichever are mounted. None: no quota, or files missing or
// unreadable (never an error: no quota is the common case).
std::optional<int> CgroupCpuLimit(const CgroupFiles& files);

// CPUs in the main thread's affinity mask (sched_getaffinity of the
// process id, so a caller thread pinned to one CPU does not shrink the
// pool); std::thread::hardware_concurrency() if that fails; at least 1.
int AffinityCpuCount();

// What the default thread count is made of, for messages (`rpa demo`).
struct CpuBudget {
  int affinity_cpus = 1;
  std::optional<int> quota_cpus;  // None: no cgroup quota.
  int cpus = 1;                   // min of the two, at least 1.
  std::string Describe() const;   // "2 CPUs (affinity 2, cgroup quota none)"
};

CpuBudget MakeCpuBudget(int affinity_cpus, std::optional<int> quota_cpus);

// The process's budget, measured once at first use and then kept: reading
// the cgroup files costs tens of microseconds, as much as a decode step.
const CpuBudget& ProcessCpuBudget();

}  // namespace rpa::internal

#endif  // RPA_SRC_THREADS_CPU_BUDGET_H_
