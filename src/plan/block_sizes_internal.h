// The tuned-table format, its lookup and the heuristic, for rpa tune and the
// tests (docs/block_sizes.md).
#ifndef RPA_SRC_PLAN_BLOCK_SIZES_INTERNAL_H_
#define RPA_SRC_PLAN_BLOCK_SIZES_INTERNAL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rpa/block_sizes.h"
#include "rpa/kernels.h"

namespace rpa::internal {

inline constexpr const char* kTunedTableFormat = "rpa-tuned-block-sizes";
// Written: sections per CPU kind. Version 1 (one table, its CPU a model
// name) is still read, as one section known by that name only.
inline constexpr int kTunedTableVersion = 2;

// What one CPU kind measured. A cpu.vendor of "" means the CPU is known by
// its model name only (a version-1 file's section, or a CPU off x86-64);
// family and model 0 mean not known.
struct TunedSection {
  CpuInfo cpu;
  std::string measured;              // UTC date "YYYY-MM-DD"; "" when not known.
  std::vector<std::string> kernels;  // DescribeKernels' lines when it was tuned; empty when not known.
  std::vector<TunedBlockSizes> entries;
};

struct TunedTable {
  std::string name;  // File path, or "<shipped table>".
  bool user = false;
  std::vector<TunedSection> sections;  // One per CPU kind.
};

// Version 2 JSON:
//   {"format": "rpa-tuned-block-sizes", "version": 2, "sections": [
//     {"cpu": {"vendor", "model_name", "family", "model", "features"},
//      "measured": "YYYY-MM-DD", "kernels": ["...", ...],
//      "entries": [{"q_dtype", "kv_dtype", "num_q_heads", "num_kv_heads",
//                   "head_dim", "page_size", "max_num_batched_tokens",
//                   "max_model_len", "num_kv_pages_per_block",
//                   "num_queries_per_block"}, ...]}, ...]}
// Version 1: {"format", "version": 1, "cpu": "<model name>", "entries": [...]}.
// A malformed table gives nullopt and an error naming the field
// ("sections[1].cpu.family must be an integer >= 0, got \"6\"").
std::optional<TunedTable> ParseTunedTable(std::string_view text, const std::string& name,
                                          std::string& error);
// Reads and parses a file; an error says when it cannot be read.
std::optional<TunedTable> ReadTunedTable(const std::string& path, std::string& error);
// Always the current version.
std::string SerializeTunedTable(const TunedTable& table);

// How a section's CPU relates to this one, best first (the lookup's order).
enum class SectionMatch {
  kThisCpu,                // Same vendor, family, model and features (by name: same model name).
  kSameVendorAndFeatures,  // Another family or model with the features dispatch reads.
  kSameVendor,             // Other dispatch features.
  kOther,                  // Another vendor, or another name where a vendor is missing.
};
SectionMatch MatchSection(const CpuInfo& section, const CpuInfo& cpu);

// rpa tune's update: `section` replaces the one of its own CPU (kThisCpu),
// in place, or is appended; the other sections stay. Returns whether one
// was replaced.
bool PutSection(TunedTable& table, TunedSection section);

// The lookup for `cpu`: sections ranked by MatchSection (the user's table
// first within a rank, then file order); the first with an entry of the
// same dtypes, heads and head_dim answers, by its entry of the same key,
// else its nearest entry; the choice names that section (and why that one).
// nullopt when no section has such an entry.
std::optional<BlockSizeChoice> ChooseFromTables(const std::vector<TunedTable>& tables,
                                                const BlockSizeConfig& config, const CpuInfo& cpu);
// The same over the tables in use (user, shipped) for this CPU.
std::optional<BlockSizeChoice> ChooseFromLoadedTables(const BlockSizeConfig& config);

struct CacheSizes {
  int64_t l1d_bytes = 0;
  int64_t l2_bytes = 0;
};
CacheSizes ThisCpuCaches();  // From sysfs, read once.
BlockSizeChoice HeuristicBlockSizes(const BlockSizeConfig& config, const CacheSizes& caches);

// Clamps pages into [1, pages_per_seq] and queries to >= 1, then shrinks
// them (the KV tile first) until one worker's scratch fits vmem (if given),
// never below 1 and never a size the caller fixed (keep_*); appends what
// it did to `note`.
BlockSizes FitBlockSizes(const BlockSizeConfig& config, BlockSizes sizes,
                         std::optional<int64_t> vmem, std::string& note, bool keep_pages = false,
                         bool keep_queries = false);

}  // namespace rpa::internal

#endif  // RPA_SRC_PLAN_BLOCK_SIZES_INTERNAL_H_
