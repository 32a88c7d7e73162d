// Pinning the pool's workers (RPA_CPU_BIND, rpa::SetCpuBinding): CPU lists,
// their errors, and the CPU each worker of a pool really runs on.
#include "threads/cpu_binding.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "rpa/error.h"
#include "rpa/threads.h"
#include "threads/cpu_list.h"
#include "threads/thread_affinity.h"
#include "threads/thread_pool.h"

namespace rpa::internal {
namespace {

template <typename Call>
std::string ErrorOf(const Call& call) {
  try {
    call();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOption);
    return e.what();
  }
  return "no error";
}

TEST(CpuListTest, ParsesCpusAndRangesInOrder) {
  EXPECT_EQ(ParseCpuList("0,2-3", "x"), (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(ParseCpuList("3,1-2", "x"), (std::vector<int>{3, 1, 2}));
  EXPECT_EQ(ParseCpuList(" 1 , 2\n", "x"), (std::vector<int>{1, 2}));
  EXPECT_EQ(ParseCpuList("5-5", "x"), (std::vector<int>{5}));
  EXPECT_TRUE(ParseCpuList("", "x").empty());
  EXPECT_TRUE(ParseCpuList("  ", "x").empty());
}

TEST(CpuListTest, RejectsWhatIsNotAList) {
  const std::string notation =
      " Write CPU numbers and ranges a-b separated by commas, as taskset -c does, e.g. 0,2-3; "
      "worker i runs on the i-th CPU listed";
  EXPECT_EQ(ErrorOf([] { ParseCpuList("0,x", "RPA_CPU_BIND='0,x'"); }),
            "RPA_CPU_BIND='0,x' is not a CPU list: 'x' is not a CPU number (0 to 65535) or a "
            "range a-b." + notation);
  EXPECT_EQ(ErrorOf([] { ParseCpuList("3-1", "RPA_CPU_BIND='3-1'"); }),
            "RPA_CPU_BIND='3-1' is not a CPU list: the range '3-1' is empty (it ends below its "
            "start)." + notation);
  for (const char* bad : {"1,,2", "-1", "1-", "0-99999", "1.5", "a-b", "2,", "0x1"}) {
    EXPECT_NE(ErrorOf([&] { ParseCpuList(bad, "RPA_CPU_BIND"); }).find("is not a CPU list"),
              std::string::npos)
        << bad;
  }
}

TEST(CpuListTest, Formats) {
  EXPECT_EQ(FormatCpuList({3, 0, 1, 2, 8}), "0-3,8");
  EXPECT_EQ(FormatCpuList({5}), "5");
  EXPECT_EQ(FormatCpuList({1, 3, 5, 6}), "1,3,5-6");
  EXPECT_EQ(FormatCpuList({}), "none");
}

TEST(CpuListTest, OnlyAllowedCpusOnce) {
  EXPECT_EQ(ErrorOf([] { CheckCpusAllowed({0, 5}, {0, 1}, "RPA_CPU_BIND='0,5'"); }),
            "RPA_CPU_BIND='0,5': CPU 5 is not in this process's affinity mask (CPUs 0-1). List "
            "only CPUs the process may run on (taskset -p PID, or /proc/self/status's "
            "Cpus_allowed_list, shows them).");
  EXPECT_EQ(ErrorOf([] { CheckCpusAllowed({1, 1}, {0, 1}, "RPA_CPU_BIND='1,1'"); }),
            "RPA_CPU_BIND='1,1': CPU 1 is listed twice. List each CPU once: two workers pinned "
            "to one CPU take turns on it instead of running at the same time.");
  EXPECT_EQ(ErrorOf([] { CheckCpusAllowed({1, 0}, {0, 1}, "x"); }), "no error");
}

TEST(CpuBindingTest, InvalidTextIsRememberedUntilReplaced) {
  CpuBinding binding;
  binding.SetFromText("0,x", "RPA_CPU_BIND='0,x'");
  EXPECT_EQ(binding.size(), 0);
  const std::string error = ErrorOf([&] { binding.Check(); });
  EXPECT_EQ(error.rfind("RPA_CPU_BIND='0,x' is not a CPU list", 0), 0u) << error;
  EXPECT_EQ(ErrorOf([&] { binding.Check(); }), error);  // Every call, not only the first.
  const std::vector<int> allowed = ProcessCpus();
  ASSERT_FALSE(allowed.empty());
  binding.Set({allowed[0]}, "test");
  EXPECT_EQ(ErrorOf([&] { binding.Check(); }), "no error");
  EXPECT_EQ(binding.cpus(), std::vector<int>{allowed[0]});
}

TEST(CpuBindingTest, RejectedSetKeepsTheBinding) {
  CpuBinding binding;
  const std::vector<int> allowed = ProcessCpus();
  binding.Set({allowed[0]}, "test");
  const uint64_t version = binding.version();
  EXPECT_NE(ErrorOf([&] { binding.Set({allowed[0], allowed[0]}, "test"); }), "no error");
  EXPECT_EQ(binding.version(), version);
  EXPECT_EQ(binding.cpus(), std::vector<int>{allowed[0]});
}

TEST(CpuBindingTest, PublicSetCpuBinding) {
  const std::vector<int> allowed = ProcessCpus();
  EXPECT_EQ(ErrorOf([&] { SetCpuBinding({allowed[0], allowed[0]}); }),
            "rpa::SetCpuBinding({" + std::to_string(allowed[0]) + ", " +
                std::to_string(allowed[0]) + "}): CPU " + std::to_string(allowed[0]) +
                " is listed twice. List each CPU once: two workers pinned to one CPU take turns "
                "on it instead of running at the same time.");
  EXPECT_NE(ErrorOf([] { SetCpuBinding({65535}); }).find("is not in this process's affinity mask"),
            std::string::npos);
  // A binding caps the default thread count; unbinding restores it.
  const int unbound = DefaultNumThreads();
  SetCpuBinding({allowed[0]});
  EXPECT_EQ(DefaultNumThreads(), 1);
  SetCpuBinding({});
  EXPECT_EQ(DefaultNumThreads(), unbound);
}

// Runs one task per worker, each waiting until all have started, so that
// every worker runs exactly one; returns each worker's affinity mask.
std::vector<std::vector<int>> WorkerMasks(ThreadPool& pool, int workers) {
  std::vector<std::vector<int>> masks(static_cast<size_t>(workers));
  std::atomic<int> started{0};
  pool.ParallelFor(workers, workers, [&](int64_t, int worker) {
    masks[static_cast<size_t>(worker)] = ThreadCpus(pthread_self());
    started.fetch_add(1);
    while (started.load() < workers) std::this_thread::yield();
  });
  return masks;
}

TEST(ThreadPoolBindingTest, WorkersRunOnTheirListedCpus) {
  const std::vector<int> allowed = ProcessCpus();
  if (allowed.size() < 2) GTEST_SKIP() << "needs 2 CPUs in the affinity mask";
  const std::vector<int> caller = ThreadCpus(pthread_self());
  CpuBinding binding;
  ThreadPool pool(&binding);
  const int a = allowed[0], b = allowed[1];

  binding.Set({a, b}, "test");
  std::vector<std::vector<int>> masks = WorkerMasks(pool, 3);
  EXPECT_EQ(masks[0], caller);                 // The calling thread is never moved.
  EXPECT_EQ(masks[1], std::vector<int>{b});    // Worker 1: the second CPU listed.
  EXPECT_EQ(masks[2], caller);                 // Past the list: the mask it started with.

  binding.Set({b, a}, "test");  // Re-pinned at the next run.
  masks = WorkerMasks(pool, 3);
  EXPECT_EQ(masks[1], std::vector<int>{a});
  EXPECT_EQ(masks[2], caller);

  binding.Set({}, "test");  // Unbound: back to the start masks.
  masks = WorkerMasks(pool, 3);
  EXPECT_EQ(masks[1], caller);
  EXPECT_EQ(ThreadCpus(pthread_self()), caller);
}

TEST(ThreadPoolBindingTest, UnboundPoolLeavesMasksAlone) {
  const std::vector<int> caller = ThreadCpus(pthread_self());
  ThreadPool pool;  // No binding at all.
  for (const std::vector<int>& mask : WorkerMasks(pool, 3)) EXPECT_EQ(mask, caller);
}

}  // namespace
}  // namespace rpa::internal
