#include "threads/cpu_binding.h"

#include <cstdlib>
#include <string>

#include "format.h"
#include "rpa/threads.h"
#include "threads/cpu_list.h"
#include "threads/thread_affinity.h"

namespace rpa {

void SetCpuBinding(const std::vector<int>& cpus) {
  std::string source = "rpa::SetCpuBinding({";
  for (size_t i = 0; i < cpus.size(); ++i) source += (i ? ", " : "") + std::to_string(cpus[i]);
  internal::ProcessCpuBinding().Set(cpus, source + "})");
}

}  // namespace rpa

namespace rpa::internal {

void CpuBinding::Set(const std::vector<int>& cpus, std::string_view source) {
  CheckCpusAllowed(cpus, ProcessCpus(), source);
  std::lock_guard<std::mutex> lock(mutex_);
  cpus_ = cpus;
  error_.reset();
  has_error_.store(false, std::memory_order_release);
  size_.store(static_cast<int>(cpus.size()), std::memory_order_release);
  version_.fetch_add(1, std::memory_order_acq_rel);
}

void CpuBinding::SetFromText(std::string_view text, std::string_view source) {
  try {
    Set(ParseCpuList(text, source), source);
  } catch (const Error& error) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = error;
    has_error_.store(true, std::memory_order_release);
  }
}

void CpuBinding::Check() const {
  if (!has_error_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_) throw *error_;
}

std::vector<int> CpuBinding::cpus() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cpus_;
}

CpuBinding& ProcessCpuBinding() {
  static CpuBinding* binding = [] {
    auto* b = new CpuBinding();  // Never destroyed, like the pool it serves.
    if (const char* env = std::getenv("RPA_CPU_BIND")) {
      b->SetFromText(env, StrCat("RPA_CPU_BIND='", env, "'"));
    }
    return b;
  }();
  return *binding;
}

}  // namespace rpa::internal
