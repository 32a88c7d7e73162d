#include "threads/cpu_list.h"

#include <algorithm>
#include <charconv>
#include <optional>

#include "format.h"

namespace rpa::internal {
namespace {

// Above any machine's CPU numbers (Linux's NR_CPUS tops out at 8192).
constexpr int kMaxCpu = 1 << 16;

constexpr std::string_view kNotation =
    "Write CPU numbers and ranges a-b separated by commas, as taskset -c does, e.g. 0,2-3; "
    "worker i runs on the i-th CPU listed";

std::string_view Trim(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\n");
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(" \t\n") - begin + 1);
}

std::optional<int> ParseCpu(std::string_view s) {
  s = Trim(s);
  int cpu = -1;
  const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), cpu);
  if (s.empty() || error != std::errc() || end != s.data() + s.size() || cpu < 0 ||
      cpu >= kMaxCpu) {
    return std::nullopt;
  }
  return cpu;
}

// One item, "3" or "1-2", appended to cpus.
void ParseItem(std::string_view item, std::string_view source, std::vector<int>& cpus) {
  const size_t dash = item.find('-');
  const std::optional<int> first = ParseCpu(item.substr(0, dash));
  const std::optional<int> last =
      dash == std::string_view::npos ? first : ParseCpu(item.substr(dash + 1));
  RPA_CHECK(first && last, ErrorKind::kOption,
            StrCat(source, " is not a CPU list: '", Trim(item),
                   "' is not a CPU number (0 to ", kMaxCpu - 1, ") or a range a-b."),
            kNotation);
  RPA_CHECK(*first <= *last, ErrorKind::kOption,
            StrCat(source, " is not a CPU list: the range '", Trim(item),
                   "' is empty (it ends below its start)."),
            kNotation);
  for (int cpu = *first; cpu <= *last; ++cpu) cpus.push_back(cpu);
}

}  // namespace

std::vector<int> ParseCpuList(std::string_view text, std::string_view source) {
  std::vector<int> cpus;
  if (Trim(text).empty()) return cpus;
  for (;;) {
    const size_t comma = text.find(',');
    ParseItem(text.substr(0, comma), source, cpus);
    if (comma == std::string_view::npos) return cpus;
    text.remove_prefix(comma + 1);
  }
}

void CheckCpusAllowed(const std::vector<int>& cpus, const std::vector<int>& allowed,
                      std::string_view source) {
  std::vector<int> seen;
  for (const int cpu : cpus) {
    RPA_CHECK(std::find(allowed.begin(), allowed.end(), cpu) != allowed.end(),
              ErrorKind::kOption,
              StrCat(source, ": CPU ", cpu, " is not in this process's affinity mask (CPUs ",
                     FormatCpuList(allowed), ")."),
              "List only CPUs the process may run on (taskset -p PID, or "
              "/proc/self/status's Cpus_allowed_list, shows them).");
    RPA_CHECK(std::find(seen.begin(), seen.end(), cpu) == seen.end(), ErrorKind::kOption,
              StrCat(source, ": CPU ", cpu, " is listed twice."),
              "List each CPU once: two workers pinned to one CPU take turns on it instead of "
              "running at the same time.");
    seen.push_back(cpu);
  }
}

std::string FormatCpuList(std::vector<int> cpus) {
  if (cpus.empty()) return "none";
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(cpus[j]);
    }
    i = j + 1;
  }
  return out;
}

}  // namespace rpa::internal
