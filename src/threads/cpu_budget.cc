#include "threads/cpu_budget.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "threads/thread_affinity.h"

namespace rpa::internal {
namespace {

namespace fs = std::filesystem;

std::string_view Trim(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\n");
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(" \t\n") - begin + 1);
}

std::optional<int64_t> ParseInt(std::string_view s) {
  s = Trim(s);
  int64_t value = 0;
  const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (error != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return value;
}

// ceil(quota / period) CPUs; none unless both are positive.
std::optional<int> QuotaCpus(std::optional<int64_t> quota, std::optional<int64_t> period) {
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
  const int64_t cpus = *quota / *period + (*quota % *period != 0 ? 1 : 0);
  return static_cast<int>(std::min<int64_t>(cpus, 1 << 20));
}

std::optional<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string_view> Split(std::string_view s, char separator) {
  std::vector<std::string_view> parts;
  for (;;) {
    const size_t at = s.find(separator);
    parts.push_back(s.substr(0, at));
    if (at == std::string_view::npos) return parts;
    s.remove_prefix(at + 1);
  }
}

bool HasCpuController(std::string_view list) {
  for (std::string_view name : Split(list, ',')) {
    if (name == "cpu") return true;
  }
  return false;
}

// One cgroup hierarchy that can hold a CPU quota.
enum class Hierarchy { kV2, kV1Cpu };

struct Mount {
  fs::path point;     // Where it is mounted.
  std::string root;   // Which cgroup of the hierarchy appears there.
};

// /proc/self/mountinfo: "id parent dev root point options [tags] - fstype source superoptions".
std::optional<Mount> FindMount(const std::string& mountinfo, Hierarchy hierarchy) {
  std::istringstream lines(mountinfo);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream before(line.substr(0, dash));
    std::istringstream after(line.substr(dash + 3));
    std::string id, parent, device, root, point, fstype, source, options;
    if (!(before >> id >> parent >> device >> root >> point)) continue;
    if (!(after >> fstype >> source >> options)) continue;
    const bool match = hierarchy == Hierarchy::kV2
                           ? fstype == "cgroup2"
                           : fstype == "cgroup" && HasCpuController(options);
    if (match) return Mount{point, root};
  }
  return std::nullopt;
}

// /proc/self/cgroup: "0::path" (v2), "id:controller,controller:path" (v1).
std::optional<std::string> FindCgroupPath(const std::string& self_cgroup, Hierarchy hierarchy) {
  std::istringstream lines(self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t first = line.find(':');
    const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string_view id = std::string_view(line).substr(0, first);
    const std::string_view controllers = std::string_view(line).substr(first + 1, second - first - 1);
    const bool match = hierarchy == Hierarchy::kV2 ? id == "0" && controllers.empty()
                                                   : HasCpuController(controllers);
    if (match) return line.substr(second + 1);
  }
  return std::nullopt;
}

// The process's cgroup directory inside the mount. Without a cgroup
// namespace a container sees the host's path, of which its mount shows only
// the part below `root`; a path outside it means the mount is the cgroup.
fs::path CgroupDirectory(const Mount& mount, const std::string& path) {
  const std::string& root = mount.root == "/" ? std::string() : mount.root;
  if (path.compare(0, root.size(), root) != 0) return mount.point;
  return mount.point / fs::path(path.substr(root.size())).relative_path();
}

std::optional<int> LimitIn(const fs::path& dir, Hierarchy hierarchy) {
  if (hierarchy == Hierarchy::kV2) {
    const std::optional<std::string> cpu_max = ReadFile(dir / "cpu.max");
    return cpu_max ? ParseCpuMax(*cpu_max) : std::nullopt;
  }
  const std::optional<std::string> quota = ReadFile(dir / "cpu.cfs_quota_us");
  const std::optional<std::string> period = ReadFile(dir / "cpu.cfs_period_us");
  return quota && period ? ParseCfsQuota(*quota, *period) : std::nullopt;
}

std::optional<int> Smaller(std::optional<int> a, std::optional<int> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

// The smallest limit from the process's cgroup up to the mount point.
std::optional<int> HierarchyLimit(const std::string& self_cgroup, const std::string& mountinfo,
                                  Hierarchy hierarchy) {
  const std::optional<Mount> mount = FindMount(mountinfo, hierarchy);
  const std::optional<std::string> path = FindCgroupPath(self_cgroup, hierarchy);
  if (!mount || !path) return std::nullopt;
  std::optional<int> limit;
  fs::path dir = CgroupDirectory(*mount, *path).lexically_normal();
  const fs::path top = mount->point.lexically_normal();
  for (int depth = 0; depth < 64; ++depth) {  // Bounded: a path has few levels.
    limit = Smaller(limit, LimitIn(dir, hierarchy));
    if (dir == top || !dir.has_relative_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
  }
  return limit;
}

}  // namespace

std::optional<int> ParseCpuMax(std::string_view text) {
  const std::vector<std::string_view> fields = Split(Trim(text), ' ');
  if (fields.size() != 2 || fields[0] == "max") return std::nullopt;
  return QuotaCpus(ParseInt(fields[0]), ParseInt(fields[1]));
}

std::optional<int> ParseCfsQuota(std::string_view quota, std::string_view period) {
  return QuotaCpus(ParseInt(quota), ParseInt(period));  // -1: no quota.
}

std::optional<int> CgroupCpuLimit(const CgroupFiles& files) {
  const std::optional<std::string> self_cgroup = ReadFile(files.self_cgroup);
  const std::optional<std::string> mountinfo = ReadFile(files.mountinfo);
  if (!self_cgroup || !mountinfo) return std::nullopt;
  return Smaller(HierarchyLimit(*self_cgroup, *mountinfo, Hierarchy::kV2),
                 HierarchyLimit(*self_cgroup, *mountinfo, Hierarchy::kV1Cpu));
}

int AffinityCpuCount() {
  const size_t cpus = ProcessCpus().size();
  if (cpus > 0) return static_cast<int>(cpus);
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

std::string CpuBudget::Describe() const {
  return std::to_string(cpus) + (cpus == 1 ? " CPU" : " CPUs") + " (affinity mask " +
         std::to_string(affinity_cpus) + ", cgroup quota " +
         (quota_cpus ? std::to_string(*quota_cpus) : std::string("none")) + ")";
}

CpuBudget MakeCpuBudget(int affinity_cpus, std::optional<int> quota_cpus) {
  CpuBudget budget;
  budget.affinity_cpus = std::max(affinity_cpus, 1);
  budget.quota_cpus = quota_cpus;
  budget.cpus = std::max(1, quota_cpus ? std::min(budget.affinity_cpus, *quota_cpus)
                                       : budget.affinity_cpus);
  return budget;
}

const CpuBudget& ProcessCpuBudget() {
  static const CpuBudget budget = MakeCpuBudget(AffinityCpuCount(), CgroupCpuLimit(CgroupFiles{}));
  return budget;
}

}  // namespace rpa::internal
