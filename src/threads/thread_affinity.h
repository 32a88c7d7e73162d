// CPU affinity masks of the process and of single threads, as lists of CPU
// numbers (any mask size: cpu_set_t's fixed 1024 CPUs are not assumed).
#ifndef RPA_SRC_THREADS_THREAD_AFFINITY_H_
#define RPA_SRC_THREADS_THREAD_AFFINITY_H_

#include <pthread.h>

#include <vector>

namespace rpa::internal {

// The CPUs in the main thread's affinity mask, ascending (sched_getaffinity
// of the process id: what taskset or a cpuset gave the process, not what a
// thread later narrowed its own mask to). Empty if it cannot be read.
std::vector<int> ProcessCpus();

// The CPUs `thread` may run on, ascending; empty if it cannot be read.
std::vector<int> ThreadCpus(pthread_t thread);

// Sets `thread`'s mask to `cpus` (pthread_setaffinity_np); false if the
// list is empty or the system refuses (a CPU offline or outside the cpuset).
bool SetThreadCpus(pthread_t thread, const std::vector<int>& cpus);

}  // namespace rpa::internal

#endif  // RPA_SRC_THREADS_THREAD_AFFINITY_H_
