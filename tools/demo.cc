// `rpa demo`: one realistic serving step (Llama-3-8B attention shapes, a mix
// of decode, chunked prefill and prefill over a fragmented bf16 cache), run
// on the production path, verified against the reference, and timed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "commands.h"
#include "rpa/rpa.h"
#include "testing/machine.h"
#include "testing/synthetic_batch.h"
#include "testing/tolerance.h"
#include "testing/workloads.h"

namespace rpa::tools {
namespace {

using testing::BatchSpec;
using testing::CountWork;
using testing::HigherLimits;
using testing::KvTolerance;
using testing::MachineLimits;
using testing::MakeSyntheticBatch;
using testing::MaxAbsDifference;
using testing::MeasureMachine;
using testing::SequenceShape;
using testing::SyntheticBatch;
using testing::ToleranceRatio;
using testing::WorkCount;

struct DemoArgs {
  int64_t num_q_heads = 32;
  int64_t num_kv_heads = 8;
  int64_t head_dim = 128;
  int64_t page_size = 16;
  std::string q_dtype = "bf16";
  std::string kv_dtype = "bf16";
  int decode = 24;
  int chunked = 2;
  int prefill = 1;
  int32_t max_kv_len = 2048;
  int32_t chunk = 64;
  int32_t prefill_len = 256;
  int iterations = 5;
  int threads = 0;
  uint64_t seed = 2026;
};

DType ParseDType(const std::string& name) {
  const std::optional<DType> dtype = DTypeFromString(name);
  if (!dtype) throw CLI::ValidationError("dtype", "unknown dtype '" + name + "'");
  return *dtype;
}

int RunDemo(const DemoArgs& args) {
  BatchSpec spec;
  spec.num_q_heads = args.num_q_heads;
  spec.num_kv_heads = args.num_kv_heads;
  spec.head_dim = args.head_dim;
  spec.page_size = args.page_size;
  spec.q_dtype = ParseDType(args.q_dtype);
  spec.kv_dtype = ParseDType(args.kv_dtype);
  spec.seed = args.seed;
  std::mt19937 rng(static_cast<uint32_t>(args.seed));
  std::uniform_int_distribution<int32_t> history(1, std::max(1, args.max_kv_len));
  for (int i = 0; i < args.decode; ++i) spec.sequences.push_back({1, history(rng)});
  for (int i = 0; i < args.chunked; ++i) {
    const int32_t kv_len = std::max(history(rng), args.chunk);
    spec.sequences.push_back({args.chunk, kv_len});
  }
  for (int i = 0; i < args.prefill; ++i) spec.sequences.push_back({args.prefill_len, args.prefill_len});
  std::shuffle(spec.sequences.begin(), spec.sequences.end(), rng);
  spec.max_num_seqs = static_cast<int64_t>(spec.sequences.size()) + 4;  // Idle slots.
  const SyntheticBatch batch = MakeSyntheticBatch(spec);

  int64_t kv_tokens = 0;
  for (const SequenceShape& s : spec.sequences) kv_tokens += s.kv_len;
  std::printf("rpa demo: %lld q heads, %lld kv heads, head_dim %lld, page_size %lld, q %s, kv %s\n",
              static_cast<long long>(spec.num_q_heads), static_cast<long long>(spec.num_kv_heads),
              static_cast<long long>(spec.head_dim), static_cast<long long>(spec.page_size),
              std::string(ToString(spec.q_dtype)).c_str(), std::string(ToString(spec.kv_dtype)).c_str());
  std::printf("batch: %d decode + %d chunked prefill (%d tokens) + %d prefill (%d tokens); "
              "%lld q tokens, %lld kv tokens, %lld pages in random order\n",
              args.decode, args.chunked, args.chunk, args.prefill, args.prefill_len,
              static_cast<long long>(batch.TotalQTokens()), static_cast<long long>(kv_tokens),
              static_cast<long long>(batch.total_num_pages));

  AttentionOptions options;
  options.sm_scale = 1.0 / std::sqrt(static_cast<double>(spec.head_dim));
  if (args.threads > 0) options.num_threads = args.threads;

  // Against this machine, measured now (shared machines drift run to run),
  // before and after the calls: a neighbour busy during one measurement
  // would make the limits, and so the roofline, look lower than they are.
  const MachineLimits limits_before = MeasureMachine(args.threads, /*quick=*/true);

  std::vector<uint8_t> out = batch.NewOutput();
  std::vector<double> times_ms;
  for (int it = 0; it < std::max(1, args.iterations); ++it) {
    const auto start = std::chrono::steady_clock::now();
    RaggedPagedAttention(
        batch.Q(), batch.KvPages(),
        PageTable{batch.KvLens(), batch.PageIndices(), batch.CuQLens(), batch.NumSeqs()}, options,
        batch.OutView(out));
    times_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times_ms.begin(), times_ms.end());
  const double median_ms = times_ms[times_ms.size() / 2];

  std::vector<uint8_t> expected = batch.NewOutput();
  RefRaggedPagedAttention(
      batch.Q(), batch.KvPages(),
      PageTable{batch.KvLens(), batch.PageIndices(), batch.CuQLens(), batch.NumSeqs()}, options,
      batch.OutView(expected));
  const double error = MaxAbsDifference(batch, out, expected);
  const double tolerance = KvTolerance(spec.kv_dtype);
  const double ratio = ToleranceRatio(batch, out, expected, tolerance);
  const bool verified = ratio <= 1.0;  // False for NaN too.

  std::printf("time per call: %.3f ms (median of %zu)   %.0f q tokens/s\n", median_ms,
              times_ms.size(), batch.TotalQTokens() / (median_ms * 1e-3));

  const MachineLimits limits =
      HigherLimits(limits_before, MeasureMachine(args.threads, /*quick=*/true));
  const WorkCount work = CountWork(spec);
  const double seconds = median_ms * 1e-3;
  const double roofline = limits.RooflineSeconds(work.flops, work.kv_bytes, spec.kv_dtype, true);
  std::printf("this machine (%d threads): read %.1f GB/s, peak %.0f GFLOP/s for %s K/V\n",
              limits.threads, limits.read_gbs[1], limits.PeakGflops(spec.kv_dtype, true),
              std::string(ToString(spec.kv_dtype)).c_str());
  std::printf("speed: %.1f GB/s of K/V, %.1f GFLOP/s -> %.2f of this machine's roofline "
              "(%.3f ms)\n",
              work.kv_bytes / seconds * 1e-9, work.flops / seconds * 1e-9, roofline / seconds,
              roofline * 1e3);
  std::printf("max abs error vs reference: %.3g (tolerance %.0e + one %s ulp: %.2f of it) -> %s\n",
              error, tolerance, std::string(ToString(spec.q_dtype)).c_str(), ratio,
              verified ? "verified" : "MISMATCH");
  return verified ? 0 : 1;
}

}  // namespace

void AddDemoCommand(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* demo = app.add_subcommand(
      "demo", "Run one realistic mixed serving step, verify it against the reference, time it");
  demo->add_option("--num-q-heads", args->num_q_heads, "Query heads")->capture_default_str();
  demo->add_option("--num-kv-heads", args->num_kv_heads, "KV heads (GQA groups)")->capture_default_str();
  demo->add_option("--head-dim", args->head_dim, "Head dimension")->capture_default_str();
  demo->add_option("--page-size", args->page_size, "Tokens per KV-cache page")->capture_default_str();
  demo->add_option("--q-dtype", args->q_dtype, "Query dtype: f32, bf16, f16")->capture_default_str();
  demo->add_option("--kv-dtype", args->kv_dtype,
                   "KV dtype: f32, bf16, f16, fp8_e4m3, fp8_e5m2, int8")->capture_default_str();
  demo->add_option("--decode", args->decode, "Decode sequences (1 new token each)")->capture_default_str();
  demo->add_option("--chunked", args->chunked, "Chunked-prefill sequences")->capture_default_str();
  demo->add_option("--chunk", args->chunk, "New tokens per chunked-prefill sequence")->capture_default_str();
  demo->add_option("--prefill", args->prefill, "Full-prefill sequences")->capture_default_str();
  demo->add_option("--prefill-len", args->prefill_len, "Tokens per full prefill")->capture_default_str();
  demo->add_option("--max-kv-len", args->max_kv_len,
                   "Longest history of a decode or chunked sequence (drawn uniformly)")->capture_default_str();
  demo->add_option("--iterations", args->iterations, "Timed calls (the median is printed)")->capture_default_str();
  demo->add_option("--threads", args->threads, "Worker threads (0: RPA_NUM_THREADS or all cores)")->capture_default_str();
  demo->add_option("--seed", args->seed, "Random seed")->capture_default_str();
  demo->callback([args] {
    const int status = RunDemo(*args);
    if (status != 0) throw CLI::RuntimeError(status);
  });
}

}  // namespace rpa::tools
