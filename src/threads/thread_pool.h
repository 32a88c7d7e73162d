// A small persistent pool of std::threads running one flat ParallelFor at a
// time.
//
// Why not OpenMP: ThreadSanitizer cannot see inside libgomp and reports false
// races there; the robustness work runs TSan on the kernel. Why persistent:
// a decode step is tens of microseconds, thread creation is about as long.
#ifndef RPA_SRC_THREADS_THREAD_POOL_H_
#define RPA_SRC_THREADS_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "threads/cpu_binding.h"

namespace rpa::internal {

class ThreadPool {
 public:
  // func(task, worker): task in [0, num_tasks), worker in [0, num_workers).
  // A worker index is used by one thread at a time, so per-worker scratch
  // needs no locking.
  // A type-erased reference to the caller's callable: no std::function, so
  // a run allocates nothing.
  using TaskFn = void (*)(const void* context, int64_t task, int worker);

  // binding: where to pin the workers (worker w >= 1 on its CPU, re-pinned
  // at the next ParallelFor after it changes); null: never pinned.
  explicit ThreadPool(const CpuBinding* binding = nullptr) : binding_(binding) {}
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs func for every task on num_workers threads (the caller is worker 0)
  // and returns when all are done. Tasks are handed out in index order from
  // one atomic counter: which worker runs a task varies, so results must not
  // depend on the worker (they use its scratch only as a temporary). Every
  // thread that takes part runs the worker-idle hooks (worker_idle_hooks.h)
  // when its share is done, before it sleeps or this returns. Calls from
  // several threads at once are serialized.
  template <class Func>
  void ParallelFor(int64_t num_tasks, int num_workers, const Func& func) {
    Run(num_tasks, num_workers, &func, [](const void* context, int64_t task, int worker) {
      (*static_cast<const Func*>(context))(task, worker);
    });
  }

 private:
  void Run(int64_t num_tasks, int num_workers, const void* context, TaskFn fn);
  void EnsureThreads(int num_threads);  // Threads besides the caller.
  void ApplyBinding();                  // Under call_mutex_.
  void WorkerLoop(int worker);
  void RunTasks(int worker);

  std::mutex call_mutex_;  // One ParallelFor at a time.
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  std::vector<std::thread> threads_;
  uint64_t generation_ = 0;  // Bumped per job; guarded by mutex_.
  int active_workers_ = 0;   // Workers (besides the caller) in this job.
  int pending_ = 0;          // Of those, how many have not finished.
  bool stop_ = false;
  const void* context_ = nullptr;
  TaskFn fn_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};

  // Pinning; all guarded by call_mutex_.
  const CpuBinding* binding_ = nullptr;
  uint64_t applied_version_ = 0;
  size_t applied_threads_ = 0;                 // Threads the binding was applied to.
  std::vector<int> pinned_cpu_;                // Per thread: its CPU, or -1 unpinned.
  std::vector<std::vector<int>> start_cpus_;   // Per thread: its mask when started.
};

// The process-wide pool the kernel uses, pinned by ProcessCpuBinding().
ThreadPool& GlobalThreadPool();

// problem.num_threads if > 0, else RPA_NUM_THREADS if a positive integer,
// else the process's CPU budget (affinity mask and cgroup quota,
// cpu_budget.h), at most the number of bound CPUs when workers are bound.
int ResolveNumThreads(int requested);

}  // namespace rpa::internal

#endif  // RPA_SRC_THREADS_THREAD_POOL_H_
