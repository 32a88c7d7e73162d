#include "threads/thread_affinity.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace rpa::internal {
namespace {

// A dynamically sized cpu_set_t (CPU_ALLOC), freed on scope exit.
class CpuSet {
 public:
  explicit CpuSet(int cpus) : cpus_(cpus), set_(CPU_ALLOC(cpus)), size_(CPU_ALLOC_SIZE(cpus)) {
    if (set_ != nullptr) CPU_ZERO_S(size_, set_);
  }
  ~CpuSet() { CPU_FREE(set_); }
  CpuSet(const CpuSet&) = delete;
  CpuSet& operator=(const CpuSet&) = delete;

  cpu_set_t* get() const { return set_; }
  size_t size() const { return size_; }
  std::vector<int> List() const {
    std::vector<int> list;
    for (int cpu = 0; cpu < cpus_; ++cpu) {
      if (CPU_ISSET_S(cpu, size_, set_)) list.push_back(cpu);
    }
    return list;
  }

 private:
  int cpus_;
  cpu_set_t* set_;
  size_t size_;
};

// Reads a mask with `get(size, set)`, growing the set while the kernel's
// mask does not fit (EINVAL).
template <typename Get>
std::vector<int> ReadMask(const Get& get) {
  for (int cpus = 1024; cpus <= (1 << 16); cpus *= 2) {
    CpuSet set(cpus);
    if (set.get() == nullptr) return {};
    const int error = get(set.size(), set.get());
    if (error == 0) return set.List();
    if (error != EINVAL) return {};
  }
  return {};
}

}  // namespace

std::vector<int> ProcessCpus() {
  return ReadMask([](size_t size, cpu_set_t* set) {
    return sched_getaffinity(getpid(), size, set) == 0 ? 0 : errno;
  });
}

std::vector<int> ThreadCpus(pthread_t thread) {
  return ReadMask([thread](size_t size, cpu_set_t* set) {
    return pthread_getaffinity_np(thread, size, set);
  });
}

bool SetThreadCpus(pthread_t thread, const std::vector<int>& cpus) {
  if (cpus.empty()) return false;
  const int highest = *std::max_element(cpus.begin(), cpus.end());
  CpuSet set(std::max(highest + 1, 1024));
  if (set.get() == nullptr) return false;
  for (const int cpu : cpus) {
    if (cpu >= 0) CPU_SET_S(cpu, set.size(), set.get());
  }
  return pthread_setaffinity_np(thread, set.size(), set.get()) == 0;
}

}  // namespace rpa::internal
