// Block sizes that pick themselves (docs/contract.md §4): a tuned table's section
// for this CPU kind (else the nearest section), the nearest tuned entry, or a
// heuristic from this CPU's caches, always clamped to [1, pages_per_seq] so an
// automatic choice can never be rejected.
#ifndef RPA_BLOCK_SIZES_H_
#define RPA_BLOCK_SIZES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rpa/dtype.h"
#include "rpa/export.h"

namespace rpa {

// The table key (docs/contract.md §4). max_model_len = page_size * pages_per_seq.
struct BlockSizeConfig {
  DType q_dtype = DType::kBF16;
  DType kv_dtype = DType::kBF16;
  int64_t num_q_heads = 32;
  int64_t num_kv_heads = 8;
  int64_t head_dim = 128;
  int64_t page_size = 16;
  int64_t max_num_batched_tokens = 512;
  int64_t max_model_len = 2048;

  int64_t PagesPerSeq() const { return (max_model_len + page_size - 1) / page_size; }
};

struct BlockSizes {
  int64_t num_kv_pages_per_block = 1;
  int64_t num_queries_per_block = 1;
  bool operator==(const BlockSizes&) const = default;
};

enum class BlockSizeSource { kTable, kNearest, kHeuristic };
RPA_EXPORT const char* ToString(BlockSizeSource source);

struct BlockSizeChoice {
  BlockSizes sizes;
  BlockSizeSource source = BlockSizeSource::kHeuristic;
  // Which entry (and from which table section, and why that section) or
  // which heuristic, with its numbers.
  std::string explanation;
  // The table section that answered, as the explanation names it
  // ("section \"AMD EPYC\" (...) of <shipped table>, this CPU's: ..."); empty
  // for the heuristic.
  std::string section;
};

// What the library uses when the caller passes no block sizes. vmem_limit_bytes
// caps one worker's scratch. Never throws; the result is in [1, pages_per_seq]
// (pages, at least 1 even when pages_per_seq is 0) and >= 1 (queries).
RPA_EXPORT BlockSizeChoice ChooseBlockSizes(const BlockSizeConfig& config,
                                            std::optional<int64_t> vmem_limit_bytes = std::nullopt);

// JAX's get_tuned_block_sizes: (num_kv_pages_per_block, num_queries_per_block).
RPA_EXPORT BlockSizes GetTunedBlockSizes(DType q_dtype, DType kv_dtype, int64_t num_q_heads,
                                         int64_t num_kv_heads, int64_t head_dim, int64_t page_size,
                                         int64_t max_num_batched_tokens, int64_t pages_per_seq);

// Loads a user table (rpa tune's JSON), whose sections then come before the
// shipped table's of the same CPU match (docs/block_sizes.md);
// RPA_TUNED_BLOCK_SIZES names one loaded on first use. A file
// that cannot be read or parsed is ignored with a warning on stderr naming
// it; returns whether it was loaded. An empty path unloads the user table.
RPA_EXPORT bool LoadTunedBlockSizes(const std::string& path);

// What a block-size sweep on this machine found fastest for one key:
// an entry of this CPU's section of a tuned table (`rpa tune`).
struct TunedBlockSizes {
  BlockSizeConfig config;
  BlockSizes sizes;
};

// Checks that `path` can take this CPU's section: it does not exist yet, or
// it is a tuned table (docs/block_sizes.md). Call it before a sweep so a
// file that is not a table fails at once. Throws rpa::Error
// (ErrorKind::kOption) naming the file and the fault ("... is not a tuned
// block-size table (sections[1].cpu.family must be ...)"); never writes.
RPA_EXPORT void CheckTunedTableFile(const std::string& path);

// What SaveTunedBlockSizes did to the file.
struct TunedTableUpdate {
  bool replaced = false;       // An earlier section of this CPU was replaced (else one was added).
  int64_t other_sections = 0;  // Other CPUs' sections, kept as they were.
};

// Writes `entries` as this CPU's section of the table at `path`: this CPU
// (ThisCpuInfo in rpa/kernels.h), today's UTC date and DescribeKernels'
// lines for the first entry's K/V dtype, replacing any earlier section of
// this CPU and keeping the other CPUs' sections; creates the file where it
// does not exist. Throws rpa::Error (ErrorKind::kOption) as
// CheckTunedTableFile does, or when the file cannot be written.
RPA_EXPORT TunedTableUpdate SaveTunedBlockSizes(const std::string& path,
                                               const std::vector<TunedBlockSizes>& entries);

// This CPU's model name (ThisCpuInfo().model_name in rpa/kernels.h): all
// that a version-1 table recorded of its CPU.
RPA_EXPORT std::string CpuModelName();

}  // namespace rpa

#endif  // RPA_BLOCK_SIZES_H_
