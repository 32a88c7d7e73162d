#include "threads/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "rpa/threads.h"
#include "threads/cpu_budget.h"
#include "threads/cpu_list.h"
#include "threads/thread_affinity.h"
#include "threads/worker_idle_hooks.h"

namespace rpa::internal {

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void ThreadPool::EnsureThreads(int num_threads) {
  while (static_cast<int>(threads_.size()) < num_threads) {
    const int worker = static_cast<int>(threads_.size()) + 1;
    threads_.emplace_back([this, worker] { WorkerLoop(worker); });
    // A thread starts with its creator's mask: what unbinding restores.
    if (binding_ != nullptr) start_cpus_.push_back(ThreadCpus(threads_.back().native_handle()));
    pinned_cpu_.push_back(-1);
  }
}

void ThreadPool::ApplyBinding() {
  if (binding_ == nullptr) return;
  const uint64_t version = binding_->version();
  if (version == applied_version_ && applied_threads_ == threads_.size()) return;
  const std::vector<int> cpus = binding_->cpus();
  for (size_t t = 0; t < threads_.size(); ++t) {
    const size_t worker = t + 1;  // Worker 0 is the caller.
    const int want = worker < cpus.size() ? cpus[worker] : -1;
    if (want == pinned_cpu_[t]) continue;
    // A refusal (a CPU taken offline since the list was checked) leaves the
    // thread where it was: past validation a call no longer fails.
    const bool done = want >= 0 ? SetThreadCpus(threads_[t].native_handle(), {want})
                                : SetThreadCpus(threads_[t].native_handle(), start_cpus_[t]);
    if (done) pinned_cpu_[t] = want;
  }
  applied_version_ = version;
  applied_threads_ = threads_.size();
}

void ThreadPool::RunTasks(int worker) {
  for (;;) {
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_) return;
    fn_(context_, task, worker);
  }
}

void ThreadPool::WorkerLoop(int worker) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_cv_.wait(lock, [&] {
        return stop_ || (generation_ != seen && worker <= active_workers_);
      });
      if (stop_) return;
      seen = generation_;
    }
    RunTasks(worker);
    RunWorkerIdleHooks();  // Before it sleeps.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::Run(int64_t num_tasks, int num_workers, const void* context, TaskFn fn) {
  if (num_tasks <= 0) return;
  if (num_workers > num_tasks) num_workers = static_cast<int>(num_tasks);
  if (num_workers <= 1) {
    for (int64_t task = 0; task < num_tasks; ++task) fn(context, task, 0);
    RunWorkerIdleHooks();  // Before the caller's code goes on.
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    EnsureThreads(num_workers - 1);
    ApplyBinding();
    context_ = context;
    fn_ = fn;
    num_tasks_ = num_tasks;
    next_task_.store(0, std::memory_order_relaxed);
    active_workers_ = num_workers - 1;
    pending_ = num_workers - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  RunTasks(0);
  RunWorkerIdleHooks();
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  context_ = nullptr;
  fn_ = nullptr;
}

ThreadPool& GlobalThreadPool() {
  // Never destroyed: usable at exit.
  static ThreadPool* pool = new ThreadPool(&ProcessCpuBinding());
  return *pool;
}

int ResolveNumThreads(int requested) {
  if (requested > 0) return requested;
  if (const char* env = std::getenv("RPA_NUM_THREADS")) {
    char* end = nullptr;
    const long value = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && value > 0 && value <= 4096) {
      return static_cast<int>(value);
    }
  }
  const int budget = ProcessCpuBudget().cpus;
  const int bound = ProcessCpuBinding().size();
  return bound > 0 ? std::min(budget, bound) : budget;
}

}  // namespace rpa::internal

namespace rpa {

int DefaultNumThreads() { return internal::ResolveNumThreads(0); }

std::string DescribeThreads() {
  const std::vector<int> bound = internal::ProcessCpuBinding().cpus();
  return internal::ProcessCpuBudget().Describe() +
         (bound.empty() ? ", workers unpinned" : ", workers pinned to CPUs " + internal::FormatCpuList(bound));
}

}  // namespace rpa
