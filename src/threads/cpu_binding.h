// Which CPU each worker of the thread pool is pinned to (RPA_CPU_BIND,
// rpa::SetCpuBinding). Worker w >= 1 runs on cpus[w]; cpus[0] belongs to
// worker 0, the thread that calls rpa, which rpa never moves: a library
// that re-pinned its caller would move the application's own thread.
// Workers past the list keep the mask they were started with.
#ifndef RPA_SRC_THREADS_CPU_BINDING_H_
#define RPA_SRC_THREADS_CPU_BINDING_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "rpa/error.h"

namespace rpa::internal {

class CpuBinding {
 public:
  // Throws rpa::Error (kOption), naming `source`, for a CPU outside the
  // process's affinity mask or listed twice; the binding is then unchanged.
  // An empty list unpins every worker. Clears a remembered error.
  void Set(const std::vector<int>& cpus, std::string_view source);
  // Parses `text` ("0,2-3") and sets it. An invalid list is not thrown but
  // remembered for Check: RPA_CPU_BIND is read when the library is first
  // used, and its error belongs to that call, before anything is written.
  void SetFromText(std::string_view text, std::string_view source);
  // Throws the remembered error, if any. Cheap: called on every call.
  void Check() const;

  int size() const { return size_.load(std::memory_order_acquire); }
  // Bumped by every Set: the pool re-pins its threads when it changes.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  std::vector<int> cpus() const;

 private:
  mutable std::mutex mutex_;
  std::vector<int> cpus_;        // Guarded by mutex_.
  std::optional<Error> error_;   // Guarded by mutex_.
  std::atomic<bool> has_error_{false};
  std::atomic<int> size_{0};
  std::atomic<uint64_t> version_{0};
};

// The process's binding: RPA_CPU_BIND at first use, then rpa::SetCpuBinding.
CpuBinding& ProcessCpuBinding();

}  // namespace rpa::internal

#endif  // RPA_SRC_THREADS_CPU_BINDING_H_
