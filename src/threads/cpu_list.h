// CPU lists in Linux's cpuset notation ("0,2-3", as taskset -c, cpuset.cpus
// and /proc/self/status's Cpus_allowed_list write them): how RPA_CPU_BIND
// and rpa::SetCpuBinding name CPUs, and how messages print a mask.
#ifndef RPA_SRC_THREADS_CPU_LIST_H_
#define RPA_SRC_THREADS_CPU_LIST_H_

#include <string>
#include <string_view>
#include <vector>

namespace rpa::internal {

// The CPUs of `text` in the order listed ("3,1-2" is {3, 1, 2}: the order
// says which worker gets which CPU). Empty or blank text is the empty list.
// Throws rpa::Error (kOption) naming `source` (e.g. "RPA_CPU_BIND") for an
// item that is neither a CPU number nor a range a-b with a <= b.
std::vector<int> ParseCpuList(std::string_view text, std::string_view source);

// Throws rpa::Error (kOption) naming `source` unless every CPU of `cpus` is
// in `allowed` (the process's affinity mask) and none is listed twice:
// pinning a worker to a CPU the process may not use fails, and two workers
// on one CPU take turns instead of running together.
void CheckCpusAllowed(const std::vector<int>& cpus, const std::vector<int>& allowed,
                      std::string_view source);

// "0-3,8" for {0, 1, 2, 3, 8} (sorted, ranges merged); "none" when empty.
std::string FormatCpuList(std::vector<int> cpus);

}  // namespace rpa::internal

#endif  // RPA_SRC_THREADS_CPU_LIST_H_
