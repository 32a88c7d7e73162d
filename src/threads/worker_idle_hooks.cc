#include "threads/worker_idle_hooks.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace rpa::internal {
namespace {

// constinit: filled before any dynamic initializer runs, so a hook added by
// another file's static initializer finds the list ready. A slot is taken
// (the count) before it is written: a reader between the two sees a null
// slot and skips it.
constinit std::atomic<int> hook_count{0};
constinit std::atomic<WorkerIdleHook> hooks[kMaxWorkerIdleHooks] = {};

}  // namespace

void AddWorkerIdleHook(WorkerIdleHook hook) {
  const int slot = hook_count.fetch_add(1, std::memory_order_relaxed);
  if (slot >= kMaxWorkerIdleHooks) {
    std::fprintf(stderr, "rpa: more than kMaxWorkerIdleHooks=%d worker-idle hooks\n",
                 kMaxWorkerIdleHooks);
    std::abort();
  }
  hooks[slot].store(hook, std::memory_order_release);
}

void RunWorkerIdleHooks() {
  const int count = std::min(hook_count.load(std::memory_order_relaxed), kMaxWorkerIdleHooks);
  for (int i = 0; i < count; ++i) {
    if (const WorkerIdleHook hook = hooks[i].load(std::memory_order_acquire)) hook();
  }
}

}  // namespace rpa::internal
