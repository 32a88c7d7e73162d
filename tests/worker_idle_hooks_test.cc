// The thread pool's worker-idle hooks (threads/worker_idle_hooks.h): every
// thread that takes part in a ParallelFor runs them after its last task,
// before it sleeps or returns to the caller; adding one while pools run is
// safe (`make test-tsan` runs these under ThreadSanitizer).
#include "threads/worker_idle_hooks.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>

#include "threads/thread_pool.h"

namespace rpa::internal {
namespace {

// Hooks stay for the process: the counters are reset by each test, and the
// tasks of other tests add nothing to tasks_before_idle.
std::atomic<int> idle_calls{0};
std::atomic<int64_t> tasks_before_idle{0};
thread_local int64_t tasks_since_idle = 0;

// Counts its calls and, per thread, the tasks run since that thread's last.
void CountingHook() {
  idle_calls.fetch_add(1);
  tasks_before_idle.fetch_add(tasks_since_idle);
  tasks_since_idle = 0;
}

void AddCountingHookOnce() {
  static const bool added = (AddWorkerIdleHook(&CountingHook), true);
  EXPECT_TRUE(added);
}

TEST(WorkerIdleHooks, EveryThreadRunsThemAfterItsTasks) {
  AddCountingHookOnce();
  ThreadPool pool;
  // One worker: the caller alone (the pool's threads stay asleep).
  for (const int workers : {1, 3}) {
    idle_calls = 0;
    tasks_before_idle = 0;
    pool.ParallelFor(64, workers, [](int64_t, int) { ++tasks_since_idle; });
    // Every thread of the call, each after all the tasks it ran.
    EXPECT_EQ(idle_calls.load(), workers);
    EXPECT_EQ(tasks_before_idle.load(), 64) << workers << " workers";
    EXPECT_EQ(tasks_since_idle, 0) << workers << " workers";
  }
}

std::atomic<int> late_calls{0};
void LateHook() { late_calls.fetch_add(1); }

TEST(WorkerIdleHooks, AddedWhilePoolsRunThenRunByTheNext) {
  static bool added = false;  // Once per process: hooks are never removed.
  if (added) GTEST_SKIP() << "the late hook was added by an earlier repetition";
  added = true;
  ThreadPool pool;
  std::thread adder([] { AddWorkerIdleHook(&LateHook); });
  for (int i = 0; i < 200; ++i) pool.ParallelFor(8, 2, [](int64_t, int) {});
  adder.join();
  late_calls = 0;
  pool.ParallelFor(8, 2, [](int64_t, int) {});
  EXPECT_EQ(late_calls.load(), 2);
}

}  // namespace
}  // namespace rpa::internal
