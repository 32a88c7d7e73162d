// The default thread count's inputs: cgroup quota files (v2 cpu.max, v1
// cfs quota and period) found through fixture copies of /proc/self/cgroup
// and /proc/self/mountinfo, and how they combine with the affinity mask.
#include "threads/cpu_budget.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <unistd.h>

#include "threads/cpu_binding.h"
#include "threads/thread_affinity.h"
#include "threads/thread_pool.h"

namespace rpa::internal {
namespace {

namespace fs = std::filesystem;

TEST(CpuBudgetTest, ParsesCgroupV2CpuMax) {
  EXPECT_EQ(ParseCpuMax("200000 100000\n"), 2);
  EXPECT_EQ(ParseCpuMax("150000 100000"), 2);  // 1.5 CPUs: 2 threads, ceil.
  EXPECT_EQ(ParseCpuMax("50000 100000\n"), 1);
  EXPECT_EQ(ParseCpuMax("max 100000\n"), std::nullopt);
  EXPECT_EQ(ParseCpuMax("max"), std::nullopt);
  for (const char* garbage : {"", "banana", "100000", "0 100000", "-5 100000", "1 2 3",
                              "100000 0", "1e5 100000", "100000 x"}) {
    EXPECT_EQ(ParseCpuMax(garbage), std::nullopt) << "'" << garbage << "'";
  }
}

TEST(CpuBudgetTest, ParsesCgroupV1Quota) {
  EXPECT_EQ(ParseCfsQuota("250000\n", "100000\n"), 3);
  EXPECT_EQ(ParseCfsQuota("100000", "100000"), 1);
  EXPECT_EQ(ParseCfsQuota("-1\n", "100000\n"), std::nullopt);
  EXPECT_EQ(ParseCfsQuota("junk", "100000"), std::nullopt);
  EXPECT_EQ(ParseCfsQuota("100000", ""), std::nullopt);
}

TEST(CpuBudgetTest, CombinesAffinityAndQuota) {
  EXPECT_EQ(MakeCpuBudget(8, 2).cpus, 2);
  EXPECT_EQ(MakeCpuBudget(2, 16).cpus, 2);
  EXPECT_EQ(MakeCpuBudget(4, std::nullopt).cpus, 4);
  EXPECT_EQ(MakeCpuBudget(0, std::nullopt).cpus, 1);
  EXPECT_EQ(MakeCpuBudget(8, 2).Describe(), "2 CPUs (affinity mask 8, cgroup quota 2)");
  EXPECT_EQ(MakeCpuBudget(1, std::nullopt).Describe(), "1 CPU (affinity mask 1, cgroup quota none)");
}

TEST(CpuBudgetTest, ProcessBudgetIsTheDefaultThreadCount) {
  unsetenv("RPA_NUM_THREADS");
  const CpuBudget& budget = ProcessCpuBudget();
  EXPECT_EQ(budget.affinity_cpus, static_cast<int>(ProcessCpus().size()));
  EXPECT_GE(budget.cpus, 1);
  EXPECT_LE(budget.cpus, budget.affinity_cpus);
  if (ProcessCpuBinding().size() == 0) {
    EXPECT_EQ(ResolveNumThreads(0), budget.cpus);
  }
}

// A fake /proc/self/cgroup, /proc/self/mountinfo and cgroup tree in a temp dir.
class CgroupFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("rpa_cgroup_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    files_.self_cgroup = (root_ / "self_cgroup").string();
    files_.mountinfo = (root_ / "mountinfo").string();
  }
  void TearDown() override { fs::remove_all(root_); }

  void Write(const fs::path& relative, const std::string& text) {
    const fs::path path = root_ / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  // One mountinfo line for a hierarchy mounted at root_/point.
  std::string MountLine(const std::string& root, const std::string& point,
                        const std::string& fstype, const std::string& options) {
    return "31 23 0:28 " + root + " " + (root_ / point).string() + " rw,relatime shared:9 - " +
           fstype + " cgroup " + options + "\n";
  }

  fs::path root_;
  CgroupFiles files_;
};

TEST_F(CgroupFixture, V2QuotaOfTheProcessCgroup) {
  Write("mountinfo", MountLine("/", "v2", "cgroup2", "rw,nsdelegate"));
  Write("self_cgroup", "0::/kubepods/pod1\n");
  Write("v2/kubepods/pod1/cpu.max", "150000 100000\n");
  EXPECT_EQ(CgroupCpuLimit(files_), 2);
}

TEST_F(CgroupFixture, V2ParentLimitBindsTheChild) {
  Write("mountinfo", MountLine("/", "v2", "cgroup2", "rw"));
  Write("self_cgroup", "0::/a/b\n");
  Write("v2/a/b/cpu.max", "max 100000\n");
  Write("v2/a/cpu.max", "300000 100000\n");
  Write("v2/cpu.max", "800000 100000\n");
  EXPECT_EQ(CgroupCpuLimit(files_), 3);
}

TEST_F(CgroupFixture, V1CpuController) {
  Write("mountinfo", MountLine("/", "memory", "cgroup", "rw,memory") +
                         MountLine("/", "cpu,cpuacct", "cgroup", "rw,cpu,cpuacct"));
  Write("self_cgroup", "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n");
  Write("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "200000\n");
  Write("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  Write("memory/docker/abc/cpu.cfs_quota_us", "100000\n");  // Not the cpu controller.
  Write("memory/docker/abc/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuLimit(files_), 2);
}

// A container without a cgroup namespace: the host's path, mounted at its root.
TEST_F(CgroupFixture, V1MountRootIsTheProcessCgroup) {
  Write("mountinfo", MountLine("/docker/abc", "cpu", "cgroup", "rw,cpu"));
  Write("self_cgroup", "4:cpu:/docker/abc\n");
  Write("cpu/cpu.cfs_quota_us", "400000\n");
  Write("cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuLimit(files_), 4);
}

TEST_F(CgroupFixture, HybridTakesTheSmallerLimit) {
  Write("mountinfo", MountLine("/", "unified", "cgroup2", "rw") +
                         MountLine("/", "cpu", "cgroup", "rw,cpu"));
  Write("self_cgroup", "1:cpu:/\n0::/\n");
  Write("unified/cpu.max", "400000 100000\n");
  Write("cpu/cpu.cfs_quota_us", "200000\n");
  Write("cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuLimit(files_), 2);
}

TEST_F(CgroupFixture, NoLimit) {
  Write("mountinfo", MountLine("/", "unified", "cgroup2", "rw") +
                         MountLine("/", "cpu", "cgroup", "rw,cpu"));
  Write("self_cgroup", "1:cpu:/\n0::/\n");
  Write("unified/cpu.max", "max 100000\n");
  Write("cpu/cpu.cfs_quota_us", "-1\n");
  Write("cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuLimit(files_), std::nullopt);
}

TEST_F(CgroupFixture, GarbageAndMissingFilesMeanNoLimit) {
  EXPECT_EQ(CgroupCpuLimit(files_), std::nullopt);  // Neither file exists.
  Write("mountinfo", "not a mountinfo line\n\n31 23 0:28 / - \n");
  Write("self_cgroup", "garbage\n0::/\n");
  EXPECT_EQ(CgroupCpuLimit(files_), std::nullopt);
  Write("mountinfo", MountLine("/", "v2", "cgroup2", "rw"));
  Write("v2/cpu.max", "banana\n");
  EXPECT_EQ(CgroupCpuLimit(files_), std::nullopt);
  Write("v2/cpu.max", "0 100000\n");
  EXPECT_EQ(CgroupCpuLimit(files_), std::nullopt);
  // A cgroup directory that is gone: its ancestors still count.
  Write("self_cgroup", "0::/gone/away\n");
  Write("v2/cpu.max", "100000 100000\n");
  EXPECT_EQ(CgroupCpuLimit(files_), 1);
}

}  // namespace
}  // namespace rpa::internal
