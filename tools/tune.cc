// `rpa tune`: sweep block sizes on this machine and write its section of a
// tuned table, keeping the file's other sections;
// `rpa tune --check`: compare the automatic choice (from this CPU's section
// where the tables in use have one) with the sweep's best;
// `rpa explain`: which block sizes the library would choose, and why.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "rpa/block_sizes.h"
#include "rpa/kernels.h"
#include "rpa/rpa.h"
#include "testing/synthetic_batch.h"
#include "testing/workloads.h"

namespace rpa::tools {
namespace {

using testing::BatchSpec;
using testing::DecodeSequences;
using testing::HeadConfig;
using testing::MakeSyntheticBatch;
using testing::MixedSequences;
using testing::ModelPresets;
using testing::PrefillSequences;
using testing::SequenceShape;
using testing::SyntheticBatch;

using Clock = std::chrono::steady_clock;

struct TuneArgs {
  std::vector<std::string> presets;
  std::string config_file;
  std::string output = "tuned_block_sizes.json";
  std::string q_dtype = "bf16";
  std::string kv_dtype = "bf16";
  int64_t page_size = 16;
  int64_t max_model_len = 4096;
  int threads = 0;
  bool quick = false;
  bool check = false;
  bool json = false;
};

DType ParseDTypeOrThrow(const std::string& name) {
  const std::optional<DType> dtype = DTypeFromString(name);
  if (!dtype) throw CLI::ValidationError("dtype", "unknown dtype '" + name + "'");
  return *dtype;
}

std::vector<HeadConfig> SelectedConfigs(const TuneArgs& args) {
  std::vector<HeadConfig> configs;
  if (!args.config_file.empty()) {
    // {"configs": [{"name": ..., "num_q_heads": ..., "num_kv_heads": ..., "head_dim": ...}]}
    std::ifstream file(args.config_file);
    if (!file) throw CLI::ValidationError("--config", "cannot read " + args.config_file);
    const nlohmann::json json = nlohmann::json::parse(file);
    for (const nlohmann::json& c : json.at("configs")) {
      configs.push_back({c.value("name", "config"), c.at("num_q_heads").get<int64_t>(),
                         c.at("num_kv_heads").get<int64_t>(), c.at("head_dim").get<int64_t>()});
    }
  }
  // No presets named and no config file: every preset.
  const bool every_preset = args.presets.empty() && configs.empty();
  for (const HeadConfig& preset : ModelPresets()) {
    const bool wanted = every_preset || std::find(args.presets.begin(), args.presets.end(),
                                                  preset.name) != args.presets.end();
    if (wanted) configs.push_back(preset);
  }
  if (configs.empty()) throw CLI::ValidationError("--preset", "no such preset");
  return configs;
}

struct Workload {
  std::string name;
  std::vector<SequenceShape> sequences;
};

std::vector<Workload> Workloads(bool quick) {
  return {{"decode", DecodeSequences()},
          {"prefill", PrefillSequences(quick ? 1024 : 2048)},
          {"mixed", MixedSequences()}};
}

// The fastest time of each option set over `rounds` rounds of one call per
// set, interleaved so load from other processes drifts over all alike. The
// fastest, not the median: on this shared machine interference only adds
// time, and in bursts that can make half the calls 1.6x slower, which flips
// a median between modes while the fastest call stays put.
std::vector<double> FastestMs(const SyntheticBatch& batch, const std::vector<AttentionOptions>& sets,
                              int rounds, std::vector<uint8_t>& out) {
  std::vector<std::vector<double>> times(sets.size());
  for (int i = 0; i < rounds; ++i) {
    for (size_t k = 0; k < sets.size(); ++k) {
      const Clock::time_point start = Clock::now();
      RaggedPagedAttention(
          batch.Q(), batch.KvPages(),
          PageTable{batch.KvLens(), batch.PageIndices(), batch.CuQLens(), batch.NumSeqs()}, sets[k],
          batch.OutView(out));
      times[k].push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
  }
  std::vector<double> fastest;
  for (const std::vector<double>& t : times) fastest.push_back(*std::min_element(t.begin(), t.end()));
  return fastest;
}

double FastestMs(const SyntheticBatch& batch, const AttentionOptions& options, int reps,
                 std::vector<uint8_t>& out) {
  return FastestMs(batch, std::vector<AttentionOptions>{options}, reps, out)[0];
}

struct Candidate {
  BlockSizes sizes;
  double ms = 0.0;
};

struct SweepResult {
  BlockSizes best;       // TieBreak's choice.
  double best_ms = 0.0;  // The fastest candidate's time.
  int measured = 0;
};

// Candidates: KV tiles of 1..128 pages up to 2048 tokens, query tiles of
// 8..256 (only one when every q_len is 1: the query tile cannot matter).
// --quick keeps the middle of both ranges, where every winner so far lies.
std::vector<Candidate> Candidates(const BlockSizeConfig& config, int32_t max_q_len, bool quick) {
  std::vector<Candidate> candidates;
  // A decode batch cannot tell query tiles apart; 16 is what a neighbouring
  // batch with a few longer queries would want from this entry.
  std::vector<int64_t> queries = {16};
  if (max_q_len > 1) {
    queries = quick ? std::vector<int64_t>{16, 32, 64, 128} : std::vector<int64_t>{8, 16, 32, 64, 128, 256};
  }
  for (int64_t pages = quick ? 2 : 1; pages <= (quick ? 32 : 128); pages *= 2) {
    if (pages > config.PagesPerSeq() || pages * config.page_size > 2048) break;
    for (int64_t q : queries) {
      if (q > 2 * max_q_len && q != queries.front()) continue;
      candidates.push_back({{pages, q}, 0.0});
    }
  }
  return candidates;
}

class Progress {
 public:
  explicit Progress(int total) : total_(total), start_(Clock::now()) {}
  void Step(const std::string& what) {
    ++done_;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    const double left = done_ > 0 ? elapsed / done_ * (total_ - done_) : 0.0;
    const int width = 30;
    const int filled = total_ > 0 ? width * done_ / total_ : width;
    std::fprintf(stderr, "\r[%s%s] %d/%d %-36s %5.0fs elapsed, ~%4.0fs left", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), done_, total_, what.c_str(), elapsed, left);
    if (done_ >= total_) std::fprintf(stderr, "\n");
  }
  void Extend(int more) { total_ += more; }

 private:
  int total_;
  int done_ = 0;
  Clock::time_point start_;
};

// Candidates this close to the fastest are as fast within the run-to-run
// spread of the fastest-of-N timings on a shared machine (decode's choice
// changed between runs minutes apart: docs/kernel_log.md, fourth session of
// 2026-12-07).
constexpr double kTieMargin = 1.03;

// Of the candidates within kTieMargin of the fastest, the one with the
// largest KV tile (then the fastest): it splits a long sequence into the
// fewest tasks, and the lookup serves keys the sweep did not measure (longer
// contexts: decode-long) from the nearest entry.
BlockSizes TieBreak(const std::vector<Candidate>& measured, double best_ms) {
  const Candidate* chosen = nullptr;
  for (const Candidate& c : measured) {
    if (c.ms > kTieMargin * best_ms) continue;
    const int64_t pages = c.sizes.num_kv_pages_per_block;
    if (chosen == nullptr || pages > chosen->sizes.num_kv_pages_per_block ||
        (pages == chosen->sizes.num_kv_pages_per_block && c.ms < chosen->ms)) {
      chosen = &c;
    }
  }
  return chosen->sizes;
}

// Measures every candidate once, then the ones within 25% of the best again
// with more repetitions (hopeless candidates are pruned after one run), and
// breaks near-ties toward the largest KV tile (TieBreak).
SweepResult Sweep(const SyntheticBatch& batch, const BlockSizeConfig& config, int32_t max_q_len,
                  const AttentionOptions& base, bool quick, Progress& progress,
                  const std::string& label) {
  std::vector<Candidate> candidates = Candidates(config, max_q_len, quick);
  std::vector<uint8_t> out = batch.NewOutput();
  SweepResult result;
  double best = 1e300;
  for (Candidate& c : candidates) {
    AttentionOptions options = base;
    options.num_kv_pages_per_block = c.sizes.num_kv_pages_per_block;
    options.num_queries_per_block = c.sizes.num_queries_per_block;
    FastestMs(batch, options, 1, out);  // Warm.
    c.ms = FastestMs(batch, options, 1, out);
    best = std::min(best, c.ms);
    ++result.measured;
    progress.Step(label);
  }
  const int reps = quick ? 3 : 7;
  std::vector<Candidate> finalists;
  result.best_ms = 1e300;
  for (Candidate& c : candidates) {
    if (c.ms > 1.25 * best) continue;
    AttentionOptions options = base;
    options.num_kv_pages_per_block = c.sizes.num_kv_pages_per_block;
    options.num_queries_per_block = c.sizes.num_queries_per_block;
    c.ms = FastestMs(batch, options, reps, out);
    result.best_ms = std::min(result.best_ms, c.ms);
    finalists.push_back(c);
  }
  result.best = TieBreak(finalists, result.best_ms);
  return result;
}

// CPUID's view of the machine, for a report.
nlohmann::json CpuJson(const CpuInfo& cpu) {
  return {{"vendor", cpu.vendor},
          {"model_name", cpu.model_name},
          {"family", cpu.family},
          {"model", cpu.model},
          {"features", cpu.features}};
}

int RunTune(const TuneArgs& args) {
  const DType q_dtype = ParseDTypeOrThrow(args.q_dtype);
  const DType kv_dtype = ParseDTypeOrThrow(args.kv_dtype);
  const std::vector<HeadConfig> configs = SelectedConfigs(args);
  // Before the sweep: a file that is not a table fails the run at once.
  try {
    CheckTunedTableFile(args.output);
  } catch (const Error& e) {
    throw CLI::ValidationError("--output", e.what());
  }
  const std::vector<Workload> workloads = Workloads(args.quick);

  AttentionOptions base;
  if (args.threads > 0) base.num_threads = args.threads;

  // Estimate the total for the progress bar: one step per candidate.
  int total = 0;
  std::vector<BlockSizeConfig> keys;
  for (const HeadConfig& head : configs) {
    for (const Workload& w : workloads) {
      BlockSizeConfig key{q_dtype, kv_dtype, head.num_q_heads, head.num_kv_heads, head.head_dim,
                          args.page_size, 0, args.max_model_len};
      int32_t max_q = 0;
      for (const SequenceShape& s : w.sequences) {
        key.max_num_batched_tokens += s.q_len;
        max_q = std::max(max_q, s.q_len);
      }
      total += static_cast<int>(Candidates(key, max_q, args.quick).size());
      keys.push_back(key);
    }
  }
  Progress progress(total);

  std::vector<TunedBlockSizes> entries;
  nlohmann::json checks = nlohmann::json::array();
  size_t key_index = 0;
  for (const HeadConfig& head : configs) {
    for (const Workload& w : workloads) {
      const BlockSizeConfig& key = keys[key_index++];
      BatchSpec spec;
      spec.num_q_heads = head.num_q_heads;
      spec.num_kv_heads = head.num_kv_heads;
      spec.head_dim = head.head_dim;
      spec.page_size = args.page_size;
      spec.q_dtype = q_dtype;
      spec.kv_dtype = kv_dtype;
      spec.sequences = w.sequences;
      spec.pages_per_seq = key.PagesPerSeq();
      spec.nan_beyond_kv_len = false;
      const SyntheticBatch batch = MakeSyntheticBatch(spec);
      int32_t max_q = 0;
      for (const SequenceShape& s : w.sequences) max_q = std::max(max_q, s.q_len);

      const SweepResult sweep =
          Sweep(batch, key, max_q, base, args.quick, progress, head.name + " " + w.name);
      entries.push_back({key, sweep.best});

      if (args.check) {
        // The three timed again side by side: the sweep's best_ms is the
        // least of many noisy timings, so it is biased low.
        std::vector<uint8_t> out = batch.NewOutput();
        const BlockSizeChoice automatic = ChooseBlockSizes(key);
        AttentionOptions best = base;
        best.num_kv_pages_per_block = sweep.best.num_kv_pages_per_block;
        best.num_queries_per_block = sweep.best.num_queries_per_block;
        AttentionOptions fixed = base;
        fixed.num_kv_pages_per_block = std::min<int64_t>(8, key.PagesPerSeq());
        fixed.num_queries_per_block = 64;
        const std::vector<double> ms =
            FastestMs(batch, {base, best, fixed}, args.quick ? 7 : 11, out);
        const double auto_ms = ms[0], best_ms = ms[1], default_ms = ms[2];
        checks.push_back({{"preset", head.name},
                          {"workload", w.name},
                          {"auto_ms", auto_ms},
                          {"best_ms", best_ms},
                          {"sweep_best_ms", sweep.best_ms},
                          {"default_ms", default_ms},
                          {"auto", {automatic.sizes.num_kv_pages_per_block, automatic.sizes.num_queries_per_block}},
                          {"auto_source", ToString(automatic.source)},
                          {"auto_section", automatic.section.empty() ? "none (the heuristic)" : automatic.section},
                          {"best", {sweep.best.num_kv_pages_per_block, sweep.best.num_queries_per_block}},
                          {"auto_over_best", auto_ms / best_ms},
                          {"auto_over_default", auto_ms / default_ms},
                          {"candidates", sweep.measured}});
      }
    }
  }

  TunedTableUpdate update;
  try {
    update = SaveTunedBlockSizes(args.output, entries);
  } catch (const Error& e) {
    std::fprintf(stderr, "rpa tune: %s\n", e.what());
    return 1;
  }
  const bool replaced = update.replaced;
  const int64_t others = update.other_sections;
  if (args.json) {
    nlohmann::json report;
    report["cpu"] = CpuJson(ThisCpuInfo());
    report["table"] = args.output;
    report["section"] = replaced ? "replaced" : "added";
    report["other_sections"] = others;
    report["checks"] = checks;
    std::cout << report.dump(2) << std::endl;
    return 0;
  }
  std::printf("wrote this CPU's section (%zu entries; %s; %s) to %s, %s; kept %lld other section%s\n",
              entries.size(), ThisCpuInfo().model_name.c_str(), ThisCpuInfo().features.c_str(),
              args.output.c_str(), replaced ? "replacing its last one" : "a new section",
              static_cast<long long>(others), others == 1 ? "" : "s");
  if (args.check) {
    std::printf("%-16s %-8s %9s %9s %10s %9s %9s  %s\n", "preset", "workload", "auto_ms", "best_ms",
                "default_ms", "auto/best", "auto/def", "auto (pages,q) / best");
    for (const nlohmann::json& c : checks) {
      std::printf("%-16s %-8s %9.3f %9.3f %10.3f %9.3f %9.3f  (%lld,%lld) %s / (%lld,%lld)\n",
                  c["preset"].get<std::string>().c_str(), c["workload"].get<std::string>().c_str(),
                  c["auto_ms"].get<double>(), c["best_ms"].get<double>(), c["default_ms"].get<double>(),
                  c["auto_over_best"].get<double>(), c["auto_over_default"].get<double>(),
                  static_cast<long long>(c["auto"][0].get<int64_t>()),
                  static_cast<long long>(c["auto"][1].get<int64_t>()),
                  c["auto_source"].get<std::string>().c_str(),
                  static_cast<long long>(c["best"][0].get<int64_t>()),
                  static_cast<long long>(c["best"][1].get<int64_t>()));
    }
    // Which sections answered auto, so a reader sees whether it was this CPU's.
    std::map<std::string, int> sections;
    for (const nlohmann::json& c : checks) ++sections[c["auto_section"].get<std::string>()];
    for (const auto& [name, rows] : sections) std::printf("auto from %s: %d rows\n", name.c_str(), rows);
  }
  return 0;
}

struct ExplainArgs {
  std::string preset;
  int64_t num_q_heads = 32;
  int64_t num_kv_heads = 8;
  int64_t head_dim = 128;
  int64_t page_size = 16;
  int64_t max_num_batched_tokens = 512;
  int64_t max_model_len = 4096;
  std::string q_dtype = "bf16";
  std::string kv_dtype = "bf16";
  int64_t vmem_limit_bytes = 0;
  std::string table;
};

int RunExplain(const ExplainArgs& args) {
  BlockSizeConfig config{ParseDTypeOrThrow(args.q_dtype), ParseDTypeOrThrow(args.kv_dtype),
                         args.num_q_heads, args.num_kv_heads, args.head_dim, args.page_size,
                         args.max_num_batched_tokens, args.max_model_len};
  if (!args.preset.empty()) {
    const auto& presets = ModelPresets();
    const auto it = std::find_if(presets.begin(), presets.end(),
                                 [&](const HeadConfig& h) { return h.name == args.preset; });
    if (it == presets.end()) throw CLI::ValidationError("--preset", "no such preset " + args.preset);
    config.num_q_heads = it->num_q_heads;
    config.num_kv_heads = it->num_kv_heads;
    config.head_dim = it->head_dim;
  }
  if (!args.table.empty() && !LoadTunedBlockSizes(args.table)) return 1;
  const BlockSizeChoice choice =
      ChooseBlockSizes(config, args.vmem_limit_bytes > 0 ? std::optional<int64_t>(args.vmem_limit_bytes)
                                                         : std::nullopt);
  std::printf("num_kv_pages_per_block=%lld num_queries_per_block=%lld  (%s; pages_per_seq=%lld)\n",
              static_cast<long long>(choice.sizes.num_kv_pages_per_block),
              static_cast<long long>(choice.sizes.num_queries_per_block), ToString(choice.source),
              static_cast<long long>(config.PagesPerSeq()));
  std::printf("why: %s\n", choice.explanation.c_str());
  std::printf("kernels for %s K/V (rows: tokens per tile x q heads per kv head; docs/kernel.md)\n%s",
              std::string(ToString(config.kv_dtype)).c_str(), DescribeKernels(config.kv_dtype).c_str());
  return 0;
}

}  // namespace

void AddTuneCommands(CLI::App& app) {
  auto tune = std::make_shared<TuneArgs>();
  CLI::App* t = app.add_subcommand("tune", "Sweep block sizes on this machine and write a tuned table");
  t->add_option("--preset", tune->presets, "Model presets (default: all): llama3-8b, llama3-70b-tp8, qwen-28-4, gemma-hd256, mqa");
  t->add_option("--config", tune->config_file, "JSON {\"configs\": [{name, num_q_heads, num_kv_heads, head_dim}]}");
  t->add_option("--output", tune->output,
                "Table file to update: this CPU's section is written, the others are kept")
      ->capture_default_str();
  t->add_option("--q-dtype", tune->q_dtype, "Query dtype")->capture_default_str();
  t->add_option("--kv-dtype", tune->kv_dtype, "KV dtype")->capture_default_str();
  t->add_option("--page-size", tune->page_size, "Tokens per page")->capture_default_str();
  t->add_option("--max-model-len", tune->max_model_len, "page_size * pages_per_seq")->capture_default_str();
  t->add_option("--threads", tune->threads, "Worker threads (0: all)")->capture_default_str();
  t->add_flag("--quick", tune->quick, "Shorter prefill and fewer repetitions (about 5 minutes for all presets)");
  t->add_flag("--check", tune->check, "Also time the automatic choice and JAX's default (8, 64) against the best");
  t->add_flag("--json", tune->json, "Print the checks as one JSON object");
  t->callback([tune] {
    if (const int status = RunTune(*tune); status != 0) throw CLI::RuntimeError(status);
  });

  auto explain = std::make_shared<ExplainArgs>();
  CLI::App* e = app.add_subcommand("explain", "Print the block sizes the library would choose, and why");
  e->add_option("--preset", explain->preset, "A model preset instead of the head options");
  e->add_option("--num-q-heads", explain->num_q_heads)->capture_default_str();
  e->add_option("--num-kv-heads", explain->num_kv_heads)->capture_default_str();
  e->add_option("--head-dim", explain->head_dim)->capture_default_str();
  e->add_option("--page-size", explain->page_size)->capture_default_str();
  e->add_option("--max-num-batched-tokens", explain->max_num_batched_tokens)->capture_default_str();
  e->add_option("--max-model-len", explain->max_model_len)->capture_default_str();
  e->add_option("--q-dtype", explain->q_dtype)->capture_default_str();
  e->add_option("--kv-dtype", explain->kv_dtype)->capture_default_str();
  e->add_option("--vmem-limit-bytes", explain->vmem_limit_bytes, "Per-worker scratch budget (0: none)");
  e->add_option("--table", explain->table, "Load this tuned table first (as RPA_TUNED_BLOCK_SIZES does)");
  e->callback([explain] {
    if (const int status = RunExplain(*explain); status != 0) throw CLI::RuntimeError(status);
  });
}

}  // namespace rpa::tools
