// The tuned-table format and the heuristic, for rpa tune and the tests.
#ifndef RPA_SRC_BLOCK_SIZES_INTERNAL_H_
#define RPA_SRC_BLOCK_SIZES_INTERNAL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rpa/block_sizes.h"

namespace rpa::internal {

inline constexpr const char* kTunedTableFormat = "rpa-tuned-block-sizes";
inline constexpr int kTunedTableVersion = 1;

struct TunedEntry {
  BlockSizeConfig config;
  BlockSizes sizes;
};

struct TunedTable {
  std::string name;  // File path, or "<shipped table>".
  std::string cpu;   // CpuModelName() of the machine it was measured on.
  bool user = false;
  std::vector<TunedEntry> entries;
};

// JSON: {"format": "rpa-tuned-block-sizes", "version": 1, "cpu": "...",
//        "entries": [{"q_dtype", "kv_dtype", "num_q_heads", "num_kv_heads",
//                     "head_dim", "page_size", "max_num_batched_tokens",
//                     "max_model_len", "num_kv_pages_per_block",
//                     "num_queries_per_block"}, ...]}
std::optional<TunedTable> ParseTunedTable(std::string_view text, const std::string& name,
                                          std::string& error);
std::string SerializeTunedTable(const TunedTable& table);

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

#endif  // RPA_SRC_BLOCK_SIZES_INTERNAL_H_
