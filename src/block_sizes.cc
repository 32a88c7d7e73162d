// Block-size choice: user table, shipped table, nearest entry, heuristic.
#include "rpa/block_sizes.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "block_sizes_internal.h"
#include "rpa/kernels.h"
#include "format.h"
#include "kernel/scratch.h"

namespace rpa {
namespace internal {
namespace {

// The shipped table, tuned on the machine kind rpa is developed on
// (data/tuned_block_sizes.json, embedded at build time).
constexpr std::string_view kShippedTable =
#include "tuned_block_sizes.inc"
    ;

// Key fields are matched after rounding up to powers of two, as JAX does:
// a table cannot list every batch size and model length.
int64_t Bucket(int64_t x) { return x <= 1 ? 1 : static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(x))); }

std::string ReadFile(const std::string& path, bool& ok) {
  std::ifstream file(path);
  ok = static_cast<bool>(file);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
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
  bool readable = false;
  const std::string text = ReadFile(path, readable);
  std::string error = "cannot be read";
  std::optional<TunedTable> table;
  if (readable) table = ParseTunedTable(text, path, error);
  if (!table) {
    std::fprintf(stderr, "rpa: warning: ignoring tuned block-size table %s: %s\n", path.c_str(),
                 error.c_str());
    return false;
  }
  table->user = true;
  tables.tables.insert(tables.tables.begin(), std::move(*table));
  return true;
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

}  // namespace

std::optional<TunedTable> ParseTunedTable(std::string_view text, const std::string& name,
                                          std::string& error) {
  try {
    const nlohmann::json json = nlohmann::json::parse(text);
    if (json.value("format", "") != kTunedTableFormat) {
      error = StrCat("\"format\" must be \"", kTunedTableFormat, "\"");
      return std::nullopt;
    }
    if (json.value("version", 0) != kTunedTableVersion) {
      error = StrCat("\"version\" must be ", kTunedTableVersion);
      return std::nullopt;
    }
    TunedTable table;
    table.name = name;
    table.cpu = json.value("cpu", "");
    for (const nlohmann::json& e : json.at("entries")) {
      TunedEntry entry;
      const auto q = DTypeFromString(e.at("q_dtype").get<std::string>());
      const auto kv = DTypeFromString(e.at("kv_dtype").get<std::string>());
      if (!q || !kv) {
        error = "unknown dtype in an entry";
        return std::nullopt;
      }
      entry.config.q_dtype = *q;
      entry.config.kv_dtype = *kv;
      entry.config.num_q_heads = e.at("num_q_heads").get<int64_t>();
      entry.config.num_kv_heads = e.at("num_kv_heads").get<int64_t>();
      entry.config.head_dim = e.at("head_dim").get<int64_t>();
      entry.config.page_size = e.at("page_size").get<int64_t>();
      entry.config.max_num_batched_tokens = e.at("max_num_batched_tokens").get<int64_t>();
      entry.config.max_model_len = e.at("max_model_len").get<int64_t>();
      entry.sizes.num_kv_pages_per_block = e.at("num_kv_pages_per_block").get<int64_t>();
      entry.sizes.num_queries_per_block = e.at("num_queries_per_block").get<int64_t>();
      if (entry.config.page_size < 1 || entry.sizes.num_kv_pages_per_block < 1 ||
          entry.sizes.num_queries_per_block < 1) {
        error = "an entry has a page_size or block size below 1";
        return std::nullopt;
      }
      table.entries.push_back(entry);
    }
    return table;
  } catch (const nlohmann::json::exception& e) {
    error = e.what();
    return std::nullopt;
  }
}

std::string SerializeTunedTable(const TunedTable& table) {
  nlohmann::json json;
  json["format"] = kTunedTableFormat;
  json["version"] = kTunedTableVersion;
  json["cpu"] = table.cpu;
  json["entries"] = nlohmann::json::array();
  for (const TunedEntry& e : table.entries) {
    json["entries"].push_back({{"q_dtype", ToString(e.config.q_dtype)},
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
  return json.dump(2) + "\n";
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
    ScratchShape shape;
    shape.rows = ScratchRows(sizes.num_queries_per_block, config.num_q_heads / num_kv_heads,
                             num_kv_heads);
    shape.head_dim = config.head_dim;
    shape.kv_block = sizes.num_kv_pages_per_block * config.page_size;
    shape.kv_dtype = config.kv_dtype;
    return ScratchBytes(shape);
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
  using internal::StrCat;
  internal::Tables& tables = internal::GlobalTables();
  BlockSizeChoice choice;
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(tables.mutex);
    internal::LoadEnvTableOnce(tables);
    const std::string this_cpu = CpuModelName();
    // Exact key: tables measured on this CPU first, then the others.
    for (int pass = 0; pass < 2 && !found; ++pass) {
      for (const internal::TunedTable& table : tables.tables) {
        if ((table.cpu == this_cpu) != (pass == 0)) continue;
        for (const internal::TunedEntry& entry : table.entries) {
          if (!internal::SameKey(entry.config, config)) continue;
          choice.sizes = entry.sizes;
          choice.source = BlockSizeSource::kTable;
          choice.explanation =
              StrCat("tuned entry of ", table.name, " (measured on ", table.cpu.empty() ? "?" : table.cpu,
                     pass == 0 ? "" : ", not this CPU", ") for ", internal::Describe(entry.config));
          found = true;
          break;
        }
        if (found) break;
      }
    }
    // Nearest entry of the same heads, head_dim and dtypes: keep its KV tile
    // in tokens (not pages), since the page size may differ.
    if (!found) {
      double best = std::numeric_limits<double>::infinity();
      for (const internal::TunedTable& table : tables.tables) {
        for (const internal::TunedEntry& entry : table.entries) {
          if (!internal::SameShape(entry.config, config)) continue;
          const double distance = internal::Distance(entry.config, config);
          if (distance >= best) continue;
          best = distance;
          const int64_t tile_tokens = entry.sizes.num_kv_pages_per_block * entry.config.page_size;
          choice.sizes.num_kv_pages_per_block =
              std::max<int64_t>(1, (tile_tokens + config.page_size / 2) / config.page_size);
          choice.sizes.num_queries_per_block = entry.sizes.num_queries_per_block;
          choice.source = BlockSizeSource::kNearest;
          choice.explanation = StrCat(
              "nearest tuned entry of ", table.name, ", ", internal::Describe(entry.config),
              " (", distance, " octaves away): its KV tile of ", tile_tokens, " tokens = ",
              choice.sizes.num_kv_pages_per_block, " pages of ", config.page_size, ", ",
              choice.sizes.num_queries_per_block, " queries");
          found = true;
        }
      }
    }
  }
  if (!found) choice = internal::HeuristicBlockSizes(config, internal::ThisCpuCaches());
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

std::string CpuModelName() { return ThisCpuInfo().model_name; }

}  // namespace rpa
