// Block-size choice: tuned sections per CPU kind (the user's table, the
// shipped one), nearest entry, heuristic.
#include "rpa/block_sizes.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "format.h"
#include "kernel/scratch.h"
#include "plan/block_sizes_internal.h"
#include "rpa/kernels.h"

namespace rpa {
namespace internal {
namespace {

using nlohmann::json;

// The shipped table: a section per CPU kind rpa is developed on
// (data/tuned_block_sizes.json, embedded at build time).
constexpr std::string_view kShippedTable =
#include "tuned_block_sizes.inc"
    ;

// Key fields are matched after rounding up to powers of two, as JAX does:
// a table cannot list every batch size and model length.
int64_t Bucket(int64_t x) { return x <= 1 ? 1 : static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(x))); }

// ---- Reading a table: every malformed field is reported by its path
// ("sections[1].entries[4].page_size"), so a hand-edited file can be fixed.

struct TableError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string Field(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : StrCat(path, ".", key);
}

std::string Element(const std::string& path, size_t index) {
  return StrCat(path, "[", static_cast<int64_t>(index), "]");
}

// The value as JSON, shortened: what a message quotes of a bad field.
std::string Shown(const json& value) {
  const std::string text = value.dump();
  return text.size() <= 40 ? text : text.substr(0, 37) + "...";
}

void RequireObject(const json& value, const std::string& path, std::string_view members) {
  if (!value.is_object()) {
    throw TableError(StrCat(path, " must be an object {", members, "}, got ", Shown(value)));
  }
}

const json& Member(const json& object, const std::string& path, std::string_view key) {
  const auto it = object.find(key);
  if (it == object.end()) throw TableError(StrCat(Field(path, key), " is missing"));
  return *it;
}

std::string ReadString(const json& object, const std::string& path, std::string_view key) {
  const json& value = Member(object, path, key);
  if (!value.is_string()) throw TableError(StrCat(Field(path, key), " must be a string, got ", Shown(value)));
  return value.get<std::string>();
}

int64_t ReadInt(const json& object, const std::string& path, std::string_view key, int64_t min,
                int64_t max = std::numeric_limits<int64_t>::max()) {
  const json& value = Member(object, path, key);
  // An unsigned value above int64's range would wrap into it.
  const bool integer = value.is_number_integer() &&
                       !(value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(max));
  if (integer && value.get<int64_t>() >= min && value.get<int64_t>() <= max) return value.get<int64_t>();
  const std::string range = max == std::numeric_limits<int64_t>::max()
                                ? StrCat(">= ", min)
                                : StrCat("in [", min, ", ", max, "]");
  throw TableError(StrCat(Field(path, key), " must be an integer ", range, ", got ", Shown(value)));
}

const json& ReadArray(const json& object, const std::string& path, std::string_view key,
                      std::string_view of) {
  const json& value = Member(object, path, key);
  if (!value.is_array()) {
    throw TableError(StrCat(Field(path, key), " must be an array of ", of, ", got ", Shown(value)));
  }
  return value;
}

DType ReadDType(const json& object, const std::string& path, std::string_view key) {
  const std::optional<DType> dtype = DTypeFromString(ReadString(object, path, key));
  if (!dtype) {
    throw TableError(StrCat(Field(path, key), " must name a dtype (\"bfloat16\", \"float32\", ...), got ",
                            Shown(object.at(key))));
  }
  return *dtype;
}

// "YYYY-MM-DD" with a month in 1..12 and a day in 1..31.
bool IsDate(std::string_view s) {
  if (s.size() != 10 || s[4] != '-' || s[7] != '-') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9}) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  const int month = (s[5] - '0') * 10 + (s[6] - '0'), day = (s[8] - '0') * 10 + (s[9] - '0');
  return month >= 1 && month <= 12 && day >= 1 && day <= 31;
}

TunedBlockSizes ParseEntry(const json& e, const std::string& path) {
  RequireObject(e, path, "q_dtype, kv_dtype, num_q_heads, ..., num_queries_per_block");
  TunedBlockSizes entry;
  BlockSizeConfig& c = entry.config;
  c.q_dtype = ReadDType(e, path, "q_dtype");
  c.kv_dtype = ReadDType(e, path, "kv_dtype");
  c.num_q_heads = ReadInt(e, path, "num_q_heads", 1);
  c.num_kv_heads = ReadInt(e, path, "num_kv_heads", 1);
  c.head_dim = ReadInt(e, path, "head_dim", 1);
  c.page_size = ReadInt(e, path, "page_size", 1);
  c.max_num_batched_tokens = ReadInt(e, path, "max_num_batched_tokens", 1);
  c.max_model_len = ReadInt(e, path, "max_model_len", 1);
  entry.sizes.num_kv_pages_per_block = ReadInt(e, path, "num_kv_pages_per_block", 1);
  entry.sizes.num_queries_per_block = ReadInt(e, path, "num_queries_per_block", 1);
  return entry;
}

std::vector<TunedBlockSizes> ParseEntries(const json& object, const std::string& path) {
  const std::string at = Field(path, "entries");
  std::vector<TunedBlockSizes> entries;
  const json& list = ReadArray(object, path, "entries", "entries");
  for (size_t i = 0; i < list.size(); ++i) entries.push_back(ParseEntry(list[i], Element(at, i)));
  return entries;
}

CpuInfo ParseCpu(const json& section, const std::string& path) {
  const std::string at = Field(path, "cpu");
  const json& cpu = Member(section, path, "cpu");
  RequireObject(cpu, at, "vendor, model_name, family, model, features");
  CpuInfo info;
  info.vendor = ReadString(cpu, at, "vendor");
  info.model_name = ReadString(cpu, at, "model_name");
  // CPUID's display family and model fit in 8 bits each.
  info.family = static_cast<int>(ReadInt(cpu, at, "family", 0, 255));
  info.model = static_cast<int>(ReadInt(cpu, at, "model", 0, 255));
  info.features = ReadString(cpu, at, "features");
  return info;
}

TunedSection ParseSection(const json& s, const std::string& path) {
  RequireObject(s, path, "cpu, measured, kernels, entries");
  TunedSection section;
  section.cpu = ParseCpu(s, path);
  section.measured = ReadString(s, path, "measured");
  if (!section.measured.empty() && !IsDate(section.measured)) {
    throw TableError(StrCat(Field(path, "measured"),
                            " must be a UTC date \"YYYY-MM-DD\" (or \"\": not known), got ",
                            Shown(s.at("measured"))));
  }
  const json& kernels = ReadArray(s, path, "kernels", "strings");
  for (size_t i = 0; i < kernels.size(); ++i) {
    if (!kernels[i].is_string()) {
      throw TableError(StrCat(Element(Field(path, "kernels"), i), " must be a string, got ", Shown(kernels[i])));
    }
    section.kernels.push_back(kernels[i].get<std::string>());
  }
  section.entries = ParseEntries(s, path);
  return section;
}

// One section per CPU kind: two would make the lookup depend on their order.
void RequireDistinctCpus(const std::vector<TunedSection>& sections) {
  for (size_t j = 0; j < sections.size(); ++j) {
    for (size_t i = 0; i < j; ++i) {
      if (MatchSection(sections[i].cpu, sections[j].cpu) != SectionMatch::kThisCpu) continue;
      throw TableError(StrCat(Element("sections", j), ".cpu is the CPU of ", Element("sections", i),
                              " (one section per CPU kind: vendor, family, model and features, "
                              "or the model name where a vendor is missing)"));
    }
  }
}

TunedTable ParseTable(const json& root, const std::string& name) {
  if (!root.is_object()) throw TableError(StrCat("the table must be a JSON object, got ", Shown(root)));
  if (root.value("format", json()) != kTunedTableFormat) {
    throw TableError(StrCat("format must be \"", kTunedTableFormat, "\""));
  }
  const json version = root.value("version", json());
  TunedTable table;
  table.name = name;
  if (version == 1) {
    // One table measured on the CPU of this model name.
    TunedSection section;
    section.cpu.model_name = ReadString(root, "", "cpu");
    section.entries = ParseEntries(root, "");
    table.sections.push_back(std::move(section));
    return table;
  }
  if (version != kTunedTableVersion) {
    throw TableError(StrCat("version must be 1 or ", kTunedTableVersion, ", got ", Shown(version)));
  }
  const json& sections = ReadArray(root, "", "sections", "sections {cpu, measured, kernels, entries}");
  for (size_t i = 0; i < sections.size(); ++i) {
    table.sections.push_back(ParseSection(sections[i], Element("sections", i)));
  }
  RequireDistinctCpus(table.sections);
  return table;
}

// ---- The lookup.

std::vector<std::string> FeatureSet(const std::string& features) {
  std::vector<std::string> set;
  std::istringstream words(features);
  for (std::string word; words >> word;) set.push_back(word);
  std::sort(set.begin(), set.end());
  return set;
}

bool KnownByNameOnly(const CpuInfo& cpu) { return cpu.vendor.empty(); }

std::string DescribeCpu(const CpuInfo& cpu) {
  if (KnownByNameOnly(cpu)) return StrCat("\"", cpu.model_name, "\" (model name only)");
  auto number = [](int n) { return n == 0 ? std::string("?") : std::to_string(n); };
  return StrCat("\"", cpu.model_name, "\" (", cpu.vendor, " family ", number(cpu.family), " model ",
                number(cpu.model), ", features ", cpu.features.empty() ? "none" : cpu.features, ")");
}

// Why a section of this rank was taken, for the explanation.
std::string WhyChosen(SectionMatch match, const CpuInfo& section, const CpuInfo& cpu) {
  switch (match) {
    case SectionMatch::kThisCpu:
      return KnownByNameOnly(section) || KnownByNameOnly(cpu)
                 ? "this CPU's (the same model name)"
                 : "this CPU's (the same vendor, family, model and dispatch features)";
    case SectionMatch::kSameVendorAndFeatures:
      return StrCat("not this CPU's; the nearest: the same vendor and dispatch features, another "
                    "family/model (this CPU: family ", cpu.family, " model ", cpu.model, ")");
    case SectionMatch::kSameVendor:
      return StrCat("not this CPU's; the nearest: the same vendor, other dispatch features (this CPU: ",
                    cpu.features.empty() ? "none" : cpu.features, ")");
    case SectionMatch::kOther: break;
  }
  return StrCat("not this CPU's nor its vendor's (this CPU: ", DescribeCpu(cpu), ")");
}

struct RankedSection {
  const TunedTable* table;
  const TunedSection* section;
  SectionMatch match;
};

// Best match first; within a rank the tables' order (the user's first),
// then the file's.
std::vector<RankedSection> RankSections(const std::vector<TunedTable>& tables, const CpuInfo& cpu) {
  std::vector<RankedSection> ranked;
  for (const TunedTable& table : tables) {
    for (const TunedSection& section : table.sections) {
      ranked.push_back({&table, &section, MatchSection(section.cpu, cpu)});
    }
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const RankedSection& a, const RankedSection& b) { return a.match < b.match; });
  return ranked;
}

std::string DescribeSection(const RankedSection& r, const CpuInfo& cpu) {
  const TunedSection& s = *r.section;
  return StrCat("section ", DescribeCpu(s.cpu), s.measured.empty() ? "" : ", measured " + s.measured,
                ", of ", r.table->name, ", ", WhyChosen(r.match, s.cpu, cpu));
}

bool SameShape(const BlockSizeConfig& a, const BlockSizeConfig& b) {
  return a.q_dtype == b.q_dtype && a.kv_dtype == b.kv_dtype && a.num_q_heads == b.num_q_heads &&
         a.num_kv_heads == b.num_kv_heads && a.head_dim == b.head_dim;
}

bool SameKey(const BlockSizeConfig& a, const BlockSizeConfig& b) {
  return SameShape(a, b) && a.page_size == b.page_size &&
         Bucket(a.max_num_batched_tokens) == Bucket(b.max_num_batched_tokens) &&
         Bucket(a.max_model_len) == Bucket(b.max_model_len);
}

// Distance in octaves over the fields a nearest entry may differ in.
double Distance(const BlockSizeConfig& a, const BlockSizeConfig& b) {
  auto octaves = [](int64_t x, int64_t y) {
    return std::fabs(std::log2(static_cast<double>(std::max<int64_t>(x, 1))) -
                     std::log2(static_cast<double>(std::max<int64_t>(y, 1))));
  };
  return octaves(a.page_size, b.page_size) +
         2.0 * octaves(a.max_num_batched_tokens, b.max_num_batched_tokens) +
         octaves(a.max_model_len, b.max_model_len);
}

std::string Describe(const BlockSizeConfig& c) {
  return StrCat("(q ", ToString(c.q_dtype), ", kv ", ToString(c.kv_dtype), ", heads ",
                c.num_q_heads, "/", c.num_kv_heads, ", head_dim ", c.head_dim, ", page_size ",
                c.page_size, ", max_num_batched_tokens ", c.max_num_batched_tokens,
                ", max_model_len ", c.max_model_len, ")");
}

// The section's entry of the same key, else its nearest entry of the same
// heads, head_dim and dtypes, which keeps its KV tile in tokens (not
// pages), since the page size may differ; nullopt when it has neither.
std::optional<BlockSizeChoice> ChooseInSection(const TunedSection& section, const BlockSizeConfig& config) {
  for (const TunedBlockSizes& entry : section.entries) {
    if (!SameKey(entry.config, config)) continue;
    return BlockSizeChoice{entry.sizes, BlockSizeSource::kTable,
                           StrCat("tuned entry for ", Describe(entry.config)), ""};
  }
  std::optional<BlockSizeChoice> choice;
  double best = std::numeric_limits<double>::infinity();
  for (const TunedBlockSizes& entry : section.entries) {
    if (!SameShape(entry.config, config)) continue;
    const double distance = Distance(entry.config, config);
    if (distance >= best) continue;
    best = distance;
    const int64_t tile_tokens = entry.sizes.num_kv_pages_per_block * entry.config.page_size;
    BlockSizes sizes;
    sizes.num_kv_pages_per_block = std::max<int64_t>(1, (tile_tokens + config.page_size / 2) / config.page_size);
    sizes.num_queries_per_block = entry.sizes.num_queries_per_block;
    choice = BlockSizeChoice{
        sizes, BlockSizeSource::kNearest,
        StrCat("nearest tuned entry, ", Describe(entry.config), " (", distance,
               " octaves away): its KV tile of ", tile_tokens, " tokens = ", sizes.num_kv_pages_per_block,
               " pages of ", config.page_size, ", ", sizes.num_queries_per_block, " queries"),
        ""};
  }
  return choice;
}

struct Tables {
  std::mutex mutex;
  std::vector<TunedTable> tables;  // User table (if any) first, then the shipped one.
  bool env_checked = false;
};

Tables& GlobalTables() {
  static Tables* tables = [] {
    auto* t = new Tables;
    std::string error;
    std::optional<TunedTable> shipped = ParseTunedTable(kShippedTable, "<shipped table>", error);
    if (shipped) t->tables.push_back(std::move(*shipped));
    return t;
  }();
  return *tables;
}

bool LoadUserTableLocked(Tables& tables, const std::string& path) {
  tables.tables.erase(std::remove_if(tables.tables.begin(), tables.tables.end(),
                                     [](const TunedTable& t) { return t.user; }),
                      tables.tables.end());
  if (path.empty()) return true;
  std::string error;
  std::optional<TunedTable> table = ReadTunedTable(path, error);
  if (!table) {
    std::fprintf(stderr, "rpa: warning: ignoring tuned block-size table %s: %s\n", path.c_str(),
                 error.c_str());
    return false;
  }
  table->user = true;
  tables.tables.insert(tables.tables.begin(), std::move(*table));
  return true;
}

// The table at `path` as SaveTunedBlockSizes updates it: the file's, so that
// its other CPUs' sections survive, or an empty one where it does not exist.
TunedTable TableToUpdate(const std::string& path) {
  if (!std::filesystem::exists(path)) return {};
  std::string error;
  std::optional<TunedTable> table = ReadTunedTable(path, error);
  if (!table) {
    ThrowInvalid(ErrorKind::kOption, StrCat(path, " is not a tuned block-size table (", error, ")."),
                 "It was left as it is: fix it or name another file.");
  }
  return std::move(*table);
}

std::string TodayUtc() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char date[16];
  std::strftime(date, sizeof(date), "%Y-%m-%d", &utc);
  return date;
}

// DescribeKernels' lines, indentation dropped: what a section records of
// the kernels it was tuned with.
std::vector<std::string> KernelLines(DType kv_dtype) {
  std::vector<std::string> lines;
  std::istringstream text(DescribeKernels(kv_dtype));
  for (std::string line; std::getline(text, line);) {
    const size_t first = line.find_first_not_of(' ');
    if (first != std::string::npos) lines.push_back(line.substr(first));
  }
  return lines;
}

void LoadEnvTableOnce(Tables& tables) {
  if (tables.env_checked) return;
  tables.env_checked = true;
  if (const char* path = std::getenv("RPA_TUNED_BLOCK_SIZES"); path != nullptr && *path) {
    LoadUserTableLocked(tables, path);
  }
}

int64_t CacheBytesFromSysfs(int index, int64_t fallback) {
  std::ifstream file("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
  std::string text;
  if (!(file >> text) || text.empty()) return fallback;
  int64_t value = std::atoll(text.c_str());
  if (text.back() == 'K') value *= 1024;
  if (text.back() == 'M') value *= 1024 * 1024;
  return value > 0 ? value : fallback;
}

}  // namespace

std::optional<TunedTable> ParseTunedTable(std::string_view text, const std::string& name,
                                          std::string& error) {
  try {
    return ParseTable(json::parse(text), name);
  } catch (const TableError& e) {
    error = e.what();
  } catch (const json::exception& e) {
    error = e.what();  // Not JSON: the parser's message says where.
  }
  return std::nullopt;
}

std::optional<TunedTable> ReadTunedTable(const std::string& path, std::string& error) {
  std::ifstream file(path);
  if (!file) {
    error = "cannot be read";
    return std::nullopt;
  }
  std::stringstream text;
  text << file.rdbuf();
  return ParseTunedTable(text.str(), path, error);
}

std::string SerializeTunedTable(const TunedTable& table) {
  // Ordered: a person reads each section's CPU, date and kernels first.
  nlohmann::ordered_json root;
  root["format"] = kTunedTableFormat;
  root["version"] = kTunedTableVersion;
  root["sections"] = nlohmann::ordered_json::array();
  for (const TunedSection& s : table.sections) {
    nlohmann::ordered_json section;
    section["cpu"] = {{"vendor", s.cpu.vendor},
                      {"model_name", s.cpu.model_name},
                      {"family", s.cpu.family},
                      {"model", s.cpu.model},
                      {"features", s.cpu.features}};
    section["measured"] = s.measured;
    section["kernels"] = s.kernels;
    section["entries"] = nlohmann::ordered_json::array();
    for (const TunedBlockSizes& e : s.entries) {
      section["entries"].push_back({{"q_dtype", ToString(e.config.q_dtype)},
                                    {"kv_dtype", ToString(e.config.kv_dtype)},
                                    {"num_q_heads", e.config.num_q_heads},
                                    {"num_kv_heads", e.config.num_kv_heads},
                                    {"head_dim", e.config.head_dim},
                                    {"page_size", e.config.page_size},
                                    {"max_num_batched_tokens", e.config.max_num_batched_tokens},
                                    {"max_model_len", e.config.max_model_len},
                                    {"num_kv_pages_per_block", e.sizes.num_kv_pages_per_block},
                                    {"num_queries_per_block", e.sizes.num_queries_per_block}});
    }
    root["sections"].push_back(std::move(section));
  }
  return root.dump(2) + "\n";
}

SectionMatch MatchSection(const CpuInfo& section, const CpuInfo& cpu) {
  // Without a vendor on either side the model name is all there is to go by.
  if (KnownByNameOnly(section) || KnownByNameOnly(cpu)) {
    return section.model_name == cpu.model_name ? SectionMatch::kThisCpu : SectionMatch::kOther;
  }
  if (section.vendor != cpu.vendor) return SectionMatch::kOther;
  if (FeatureSet(section.features) != FeatureSet(cpu.features)) return SectionMatch::kSameVendor;
  return section.family == cpu.family && section.model == cpu.model ? SectionMatch::kThisCpu
                                                                    : SectionMatch::kSameVendorAndFeatures;
}

bool PutSection(TunedTable& table, TunedSection section) {
  auto same_cpu = [&](const TunedSection& s) { return MatchSection(s.cpu, section.cpu) == SectionMatch::kThisCpu; };
  // Every section of this CPU goes (a name-only one and a CPUID one may
  // both match it); the new one takes the first one's place.
  const auto first = std::find_if(table.sections.begin(), table.sections.end(), same_cpu);
  const bool replaced = first != table.sections.end();
  const auto position = first - table.sections.begin();
  std::erase_if(table.sections, same_cpu);
  table.sections.insert(table.sections.begin() + position, std::move(section));
  return replaced;
}

std::optional<BlockSizeChoice> ChooseFromTables(const std::vector<TunedTable>& tables,
                                                const BlockSizeConfig& config, const CpuInfo& cpu) {
  std::string passed_over;
  for (const RankedSection& ranked : RankSections(tables, cpu)) {
    const std::string section = DescribeSection(ranked, cpu);
    std::optional<BlockSizeChoice> choice = ChooseInSection(*ranked.section, config);
    if (!choice) {
      passed_over += StrCat("; passed over ", section, ": no entry of these dtypes, heads and head_dim");
      continue;
    }
    choice->explanation += StrCat(" in ", section, passed_over);
    choice->section = section;
    return choice;
  }
  return std::nullopt;
}

std::optional<BlockSizeChoice> ChooseFromLoadedTables(const BlockSizeConfig& config) {
  Tables& tables = GlobalTables();
  std::lock_guard<std::mutex> lock(tables.mutex);
  LoadEnvTableOnce(tables);
  return ChooseFromTables(tables.tables, config, ThisCpuInfo());
}

CacheSizes ThisCpuCaches() {
  static const CacheSizes sizes{CacheBytesFromSysfs(0, 48 * 1024), CacheBytesFromSysfs(2, 1 << 20)};
  return sizes;
}

BlockSizeChoice HeuristicBlockSizes(const BlockSizeConfig& config, const CacheSizes& caches) {
  // A KV tile (K and V of one kv head) of about L2/16 stays resident while
  // every row of the query tile reads it, and the tile's logits (rows x
  // keys f32) take about as much; the rest of L2 holds the accumulators and
  // the next tile's prefetch. (rpa tune --check on this machine: tiles of
  // 256 tokens and ~128 rows were best for prefill; larger ones lost 30%.)
  const int64_t kv_bytes_per_token = 2 * config.head_dim * static_cast<int64_t>(SizeOf(config.kv_dtype));
  const int64_t tile_tokens = std::clamp<int64_t>(caches.l2_bytes / 16 / kv_bytes_per_token, 16, 512);
  const int64_t group = std::max<int64_t>(config.num_q_heads / std::max<int64_t>(config.num_kv_heads, 1), 1);
  const int64_t rows = std::clamp<int64_t>(caches.l2_bytes / 16 / (4 * tile_tokens), group, 512);
  BlockSizeChoice choice;
  choice.source = BlockSizeSource::kHeuristic;
  choice.sizes.num_kv_pages_per_block = std::max<int64_t>(tile_tokens / config.page_size, 1);
  // 16..64 queries: every sweep winner here lies there (rpa tune --check);
  // fewer starve the tile's reuse of K/V (MQA: 32 q heads per kv head),
  // more make the logits outgrow L2 (head_dim 256).
  const int64_t queries = std::clamp<int64_t>(
      static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(std::max<int64_t>(rows / group, 1)))),
      16, 64);
  choice.sizes.num_queries_per_block = std::min<int64_t>(queries, Bucket(config.max_num_batched_tokens));
  choice.explanation = StrCat(
      "heuristic from this CPU's L2 (", caches.l2_bytes, " B): a KV tile of ~L2/16 = ", tile_tokens,
      " tokens (", kv_bytes_per_token, " B per token of K+V) = ", choice.sizes.num_kv_pages_per_block,
      " pages of ", config.page_size, "; its logits within L2/16 -> ", rows, " rows / ", group,
      " q heads per kv head -> ", choice.sizes.num_queries_per_block, " queries (kept in 16..64)");
  return choice;
}

BlockSizes FitBlockSizes(const BlockSizeConfig& config, BlockSizes sizes,
                         std::optional<int64_t> vmem, std::string& note, bool keep_pages,
                         bool keep_queries) {
  const int64_t pages_per_seq = std::max<int64_t>(config.PagesPerSeq(), 1);
  if (sizes.num_kv_pages_per_block > pages_per_seq) {
    note += StrCat("; clamped ", sizes.num_kv_pages_per_block, " pages to pages_per_seq=",
                   pages_per_seq);
  }
  sizes.num_kv_pages_per_block = std::clamp<int64_t>(sizes.num_kv_pages_per_block, 1, pages_per_seq);
  sizes.num_queries_per_block = std::max<int64_t>(sizes.num_queries_per_block, 1);
  if (!vmem) return sizes;
  const int64_t num_kv_heads = std::max<int64_t>(config.num_kv_heads, 1);
  // The bytes the run allocates per worker for these sizes (scratch.h).
  auto bytes = [&] {
    return ScratchBytes({.q_tile = sizes.num_queries_per_block,
                         .kv_block = sizes.num_kv_pages_per_block * config.page_size,
                         .group = config.num_q_heads / num_kv_heads,
                         .num_kv_heads = num_kv_heads,
                         .head_dim = config.head_dim,
                         .kv_dtype = config.kv_dtype});
  };
  const BlockSizes before = sizes;
  while (bytes() > *vmem) {
    if (!keep_pages && sizes.num_kv_pages_per_block > 1) {
      sizes.num_kv_pages_per_block = (sizes.num_kv_pages_per_block + 1) / 2 == sizes.num_kv_pages_per_block
                                         ? sizes.num_kv_pages_per_block - 1
                                         : (sizes.num_kv_pages_per_block + 1) / 2;
    } else if (!keep_queries && sizes.num_queries_per_block > 1) {
      sizes.num_queries_per_block /= 2;
    } else {
      break;  // The smallest tiles the caller left to us.
    }
  }
  if (!(sizes == before)) {
    note += StrCat("; shrunk to fit vmem_limit_bytes=", *vmem, " (scratch ", bytes(), " bytes)");
  }
  return sizes;
}

}  // namespace internal

const char* ToString(BlockSizeSource source) {
  switch (source) {
    case BlockSizeSource::kTable: return "table";
    case BlockSizeSource::kNearest: return "nearest";
    case BlockSizeSource::kHeuristic: return "heuristic";
  }
  return "unknown";
}

BlockSizeChoice ChooseBlockSizes(const BlockSizeConfig& config,
                                 std::optional<int64_t> vmem_limit_bytes) {
  std::optional<BlockSizeChoice> tuned = internal::ChooseFromLoadedTables(config);
  BlockSizeChoice choice = tuned ? std::move(*tuned)
                                 : internal::HeuristicBlockSizes(config, internal::ThisCpuCaches());
  choice.sizes = internal::FitBlockSizes(config, choice.sizes, vmem_limit_bytes, choice.explanation);
  return choice;
}

BlockSizes GetTunedBlockSizes(DType q_dtype, DType kv_dtype, int64_t num_q_heads,
                              int64_t num_kv_heads, int64_t head_dim, int64_t page_size,
                              int64_t max_num_batched_tokens, int64_t pages_per_seq) {
  BlockSizeConfig config{q_dtype,   kv_dtype,  num_q_heads,
                         num_kv_heads, head_dim, std::max<int64_t>(page_size, 1),
                         max_num_batched_tokens, std::max<int64_t>(page_size, 1) * pages_per_seq};
  return ChooseBlockSizes(config).sizes;
}

bool LoadTunedBlockSizes(const std::string& path) {
  internal::Tables& tables = internal::GlobalTables();
  std::lock_guard<std::mutex> lock(tables.mutex);
  tables.env_checked = true;  // An explicit call wins over the environment.
  return internal::LoadUserTableLocked(tables, path);
}

void CheckTunedTableFile(const std::string& path) { internal::TableToUpdate(path); }

TunedTableUpdate SaveTunedBlockSizes(const std::string& path, const std::vector<TunedBlockSizes>& entries) {
  internal::TunedTable table = internal::TableToUpdate(path);
  internal::TunedSection section;
  section.cpu = ThisCpuInfo();
  section.measured = internal::TodayUtc();
  if (!entries.empty()) section.kernels = internal::KernelLines(entries.front().config.kv_dtype);
  section.entries = entries;
  TunedTableUpdate update;
  update.replaced = internal::PutSection(table, std::move(section));
  update.other_sections = static_cast<int64_t>(table.sections.size()) - 1;
  std::ofstream file(path);
  file << internal::SerializeTunedTable(table);
  if (!file) {
    internal::ThrowInvalid(ErrorKind::kOption, internal::StrCat("Cannot write the tuned block-size table ", path, "."),
                           "Name a file in a directory you can write to.");
  }
  return update;
}

std::string CpuModelName() { return ThisCpuInfo().model_name; }

}  // namespace rpa
