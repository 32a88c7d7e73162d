// What a thread does when its share of a ParallelFor is done, before it
// sleeps (a pool worker) or returns to the caller's code: a layer that keeps
// per-thread hardware state registers a hook here, so the pool knows nothing
// of that state. The kernel layer registers one that gives a thread's AMX
// tiles back (amx_tiles.cc), so idle threads carry no 8 KiB tile state.
#ifndef RPA_SRC_THREADS_WORKER_IDLE_HOOKS_H_
#define RPA_SRC_THREADS_WORKER_IDLE_HOOKS_H_

namespace rpa::internal {

using WorkerIdleHook = void (*)();

// At most this many hooks in a process (one today: the AMX tiles').
inline constexpr int kMaxWorkerIdleHooks = 4;

// Adds `hook` for every thread pool of the process. Safe from any thread at
// any time, static initialization included (the list needs no dynamic
// initializer); a thread running hooks meanwhile runs it from its next idle
// on. Hooks are never removed. More than kMaxWorkerIdleHooks aborts.
void AddWorkerIdleHook(WorkerIdleHook hook);

// Runs the hooks on the calling thread, in the order they were added.
void RunWorkerIdleHooks();

}  // namespace rpa::internal

#endif  // RPA_SRC_THREADS_WORKER_IDLE_HOOKS_H_
