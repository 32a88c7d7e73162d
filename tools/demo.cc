// `rpa demo`: a short continuous-batching serving loop on the production
// path (tools/demo/serving_loop.h): requests arrive, prefill in chunks,
// decode and finish while a paged KV cache hands out and takes back pages;
// every step runs attention with the K/V write for every layer of a
// llama-3-8B-shaped model, sampled steps are checked against the reference,
// and the speed is reported against this machine's measured roofline.
// Before the loop, the one mixed serving step of earlier demos is timed per
// call, so that figure stays comparable across versions.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <random>
#include <string>
#include <vector>

#include "commands.h"
#include "demo/sampled_check.h"
#include "demo/serving_loop.h"
#include "demo/step_plot.h"
#include "rpa/rpa.h"
#include "testing/machine.h"
#include "testing/synthetic_batch.h"
#include "testing/tolerance.h"
#include "testing/workloads.h"

namespace rpa::tools {
namespace {

using testing::MachineLimits;

struct DemoArgs {
  // The model (its dtypes are parsed from the two strings).
  ModelShape shape;
  std::string q_dtype = "bf16";
  std::string kv_dtype = "bf16";
  // The traffic and the engine.
  StreamSpec stream;
  SchedulerLimits limits;
  int32_t num_pages = 1024;
  int64_t steps = 0;
  int check_every = 40;
  int32_t check_rows = 4;
  // The per-call step of earlier demos.
  int decode = 24;
  int chunked = 2;
  int prefill = 1;
  int32_t max_kv_len = 2048;
  int32_t chunk = 64;
  int32_t prefill_len = 256;
  int iterations = 5;
  // The run.
  int threads = 0;
  uint64_t seed = 2026;
  bool skip_machine = false;
  std::string plot;
};

DType ParseDType(const std::string& name) {
  const std::optional<DType> dtype = DTypeFromString(name);
  if (!dtype) throw CLI::ValidationError("dtype", "unknown dtype '" + name + "'");
  return *dtype;
}

std::string Name(DType dtype) { return std::string(ToString(dtype)); }

ModelShape MakeShape(const DemoArgs& args) {
  ModelShape shape = args.shape;
  shape.q_dtype = ParseDType(args.q_dtype);
  shape.kv_dtype = ParseDType(args.kv_dtype);
  return shape;
}

AttentionOptions MakeOptions(const DemoArgs& args) {
  AttentionOptions options;
  options.sm_scale = 1.0 / std::sqrt(static_cast<double>(args.shape.head_dim));
  if (args.threads > 0) options.num_threads = args.threads;
  return options;
}

void PrintThreads(const DemoArgs& args) {
  std::printf("threads: %d (default %d: %s)\n", args.threads > 0 ? args.threads : DefaultNumThreads(),
              DefaultNumThreads(), DescribeThreads().c_str());
}

// ---- The one mixed step of earlier demos, per call.

struct PerCallResult {
  double median_ms = 0;
  int64_t q_tokens = 0;
  testing::WorkCount work;
  SampledCheck check;
};

testing::BatchSpec PerCallSpec(const DemoArgs& args, const ModelShape& shape) {
  testing::BatchSpec spec = BatchSpecOf(shape);
  spec.seed = args.seed;
  std::mt19937 rng(static_cast<uint32_t>(args.seed));
  std::uniform_int_distribution<int32_t> history(1, std::max(1, args.max_kv_len));
  for (int i = 0; i < args.decode; ++i) spec.sequences.push_back({1, history(rng)});
  for (int i = 0; i < args.chunked; ++i) {
    spec.sequences.push_back({args.chunk, std::max(history(rng), args.chunk)});
  }
  for (int i = 0; i < args.prefill; ++i) spec.sequences.push_back({args.prefill_len, args.prefill_len});
  std::shuffle(spec.sequences.begin(), spec.sequences.end(), rng);
  spec.max_num_seqs = static_cast<int64_t>(spec.sequences.size()) + 4;  // Idle slots.
  return spec;
}

PerCallResult RunPerCall(const DemoArgs& args, const ModelShape& shape,
                         const AttentionOptions& options) {
  const testing::BatchSpec spec = PerCallSpec(args, shape);
  const testing::SyntheticBatch batch = testing::MakeSyntheticBatch(spec);
  const PageTable table{batch.KvLens(), batch.PageIndices(), batch.CuQLens(), batch.NumSeqs()};
  std::vector<uint8_t> out = batch.NewOutput();
  std::vector<double> times_ms;
  for (int it = 0; it < std::max(1, args.iterations); ++it) {
    const auto start = std::chrono::steady_clock::now();
    RaggedPagedAttention(batch.Q(), batch.KvPages(), table, options, batch.OutView(out));
    times_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times_ms.begin(), times_ms.end());
  PerCallResult result;
  result.median_ms = times_ms[times_ms.size() / 2];
  result.q_tokens = batch.TotalQTokens();
  result.work = testing::CountWork(spec);
  result.check = CheckSampledRows(
      FinishedCall{batch.Q(), batch.KvPages(), table, options, batch.OutView(out)},
      args.check_rows);
  std::printf("per call (the mixed step of earlier demos: %d decode + %d chunked prefill (%d "
              "tokens) + %d prefill (%d tokens), %lld q tokens, %lld pages in random order):\n",
              args.decode, args.chunked, args.chunk, args.prefill, args.prefill_len,
              static_cast<long long>(result.q_tokens), static_cast<long long>(batch.total_num_pages));
  std::printf("  time per call: %.3f ms (median of %zu)   %.0f q tokens/s\n", result.median_ms,
              times_ms.size(), result.q_tokens / (result.median_ms * 1e-3));
  return result;
}

// ---- The loop.

LoopConfig MakeLoopConfig(const DemoArgs& args, const ModelShape& shape,
                          const AttentionOptions& options) {
  LoopConfig config;
  config.shape = shape;
  config.stream = args.stream;
  config.stream.seed = args.seed;
  config.limits = args.limits;
  config.limits.page_size = static_cast<int32_t>(shape.page_size);
  config.num_pages = args.num_pages;
  config.max_steps = args.steps;
  config.check_every = args.check_every;
  config.check_rows = args.check_rows;
  config.options = options;
  config.seed = args.seed;
  return config;
}

// One line, rewritten in place on a terminal (at most every 100 ms);
// elsewhere (a log, ctest) a line each time another quarter of the
// requests has finished. The last state is always shown.
class ProgressLine {
 public:
  ProgressLine() : tty_(isatty(STDOUT_FILENO) != 0) {}

  void Show(const LoopProgress& p) {
    last_ = p;
    last_point_ = p.last->point;
    shown_last_ = false;
    const int quarter = p.requests > 0 ? 4 * p.finished / p.requests : 4;
    const auto now = std::chrono::steady_clock::now();
    if (tty_ ? now - shown_ < std::chrono::milliseconds(100) : quarter == quarter_) return;
    shown_ = now;
    quarter_ = quarter;
    Print();
  }
  void End() {
    if (last_.step > 0 && !shown_last_) Print();
    if (tty_ && last_.step > 0) std::printf("\n");
  }

 private:
  void Print() {
    const LoopProgress& p = last_;
    const StepPoint& s = last_point_;
    std::printf("%sstep %4lld | %2d running, %2d waiting, %3d/%d done | pages free %4d/%d | "
                "%3d tokens (%d prefill + %d decode) in %6.2f ms%s",
                tty_ ? "\r" : "  ", static_cast<long long>(p.step), p.running, p.waiting,
                p.finished, p.requests, p.free_pages, p.num_pages,
                s.prefill_tokens + s.decode_tokens, s.prefill_tokens, s.decode_tokens, s.ms,
                tty_ ? "   " : "\n");
    std::fflush(stdout);
    shown_last_ = true;
  }

  bool tty_;
  int quarter_ = 0;
  std::chrono::steady_clock::time_point shown_{};
  LoopProgress last_;
  StepPoint last_point_;
  bool shown_last_ = false;
};

// Time and roofline time of the steps of one kind.
struct StepTotals {
  int steps = 0;
  double seconds = 0;
  double roofline = 0;
};

void PrintSpeed(const LoopResult& loop, const PerCallResult& per_call,
                const MachineLimits& limits, DType kv_dtype) {
  StepTotals with_prefill, decode_only;
  for (const StepRecord& r : loop.steps) {
    StepTotals& t = r.point.prefill_tokens > 0 ? with_prefill : decode_only;
    ++t.steps;
    t.seconds += r.point.ms * 1e-3;
    t.roofline += limits.RooflineSeconds(r.work.flops, r.work.kv_bytes, kv_dtype, true);
  }
  std::printf("this machine (%d threads): read %.1f GB/s, peak %.0f GFLOP/s for %s K/V\n",
              limits.threads, limits.read_gbs[1], limits.PeakGflops(kv_dtype, true),
              Name(kv_dtype).c_str());
  auto fraction = [](const StepTotals& t) { return t.seconds > 0 ? t.roofline / t.seconds : 0; };
  StepTotals all{with_prefill.steps + decode_only.steps, with_prefill.seconds + decode_only.seconds,
                 with_prefill.roofline + decode_only.roofline};
  std::printf("fraction of this machine's roofline: %.2f over all steps (steps with prefill "
              "%.2f, %d steps; decode-only steps %.2f, %d steps)\n",
              fraction(all), fraction(with_prefill), with_prefill.steps, fraction(decode_only),
              decode_only.steps);
  const double seconds = per_call.median_ms * 1e-3;
  const double roofline =
      limits.RooflineSeconds(per_call.work.flops, per_call.work.kv_bytes, kv_dtype, true);
  std::printf("per call: %.1f GB/s of K/V, %.1f GFLOP/s -> %.2f of this machine's roofline "
              "(%.3f ms)\n",
              per_call.work.kv_bytes / seconds * 1e-9, per_call.work.flops / seconds * 1e-9,
              roofline / seconds, roofline * 1e3);
}

void PrintLoop(const LoopResult& loop, const ModelShape& shape) {
  std::printf("loop: %zu steps, %d/%d requests finished, %.2f s of attention (%d layers a step, "
              "%.2f ms a step on average)\n",
              loop.steps.size(), loop.finished, loop.requests, loop.seconds, shape.layers,
              loop.steps.empty() ? 0.0 : loop.seconds * 1e3 / loop.steps.size());
  std::printf("throughput: prefill %lld tokens, %.0f tokens/s; decode %lld tokens, %.0f tokens/s "
              "(each over the loop's attention time, as vLLM's prompt and generation "
              "throughputs)\n",
              static_cast<long long>(loop.prefill_tokens),
              loop.seconds > 0 ? loop.prefill_tokens / loop.seconds : 0.0,
              static_cast<long long>(loop.decode_tokens),
              loop.seconds > 0 ? loop.decode_tokens / loop.seconds : 0.0);
}

bool PrintChecks(const LoopResult& loop, const PerCallResult& per_call, const ModelShape& shape,
                 int32_t check_rows) {
  const double tolerance = testing::KvTolerance(shape.kv_dtype);
  std::printf("checked against RefRaggedPagedAttention: %d sampled steps, one layer each, "
              "%lld rows (the first and last %d query rows of every sequence), worst %.2f of "
              "the tolerance (%.0e + one %s ulp) -> %s\n",
              loop.checks, static_cast<long long>(loop.checked_rows), check_rows, loop.worst_ratio,
              tolerance, Name(shape.q_dtype).c_str(), loop.Passed() ? "verified" : "MISMATCH");
  std::printf("checked the per-call step the same way: %lld rows, worst %.2f -> %s\n",
              static_cast<long long>(per_call.check.rows), per_call.check.ratio,
              per_call.check.Passed() ? "verified" : "MISMATCH");
  return loop.Passed() && per_call.check.Passed();
}

// Returns false, having said why, when the file cannot be written.
bool WritePlot(const std::string& path, const LoopResult& loop, const ModelShape& shape) {
  std::vector<StepPoint> points;
  for (const StepRecord& r : loop.steps) points.push_back(r.point);
  const std::string title = "rpa demo: " + std::to_string(shape.layers) + " layers, " +
                            std::to_string(shape.num_q_heads) + "/" +
                            std::to_string(shape.num_kv_heads) + " heads, head_dim " +
                            std::to_string(shape.head_dim) + ", " + Name(shape.kv_dtype) +
                            " k/v";
  try {
    WritePng(DrawStepPlot(points, title).get(), path);
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "rpa demo: %s\n", e.what());
    return false;
  }
  std::printf("plot: %s (step time and tokens per step)\n", path.c_str());
  return true;
}

int RunDemo(const DemoArgs& args) {
  const ModelShape shape = MakeShape(args);
  const AttentionOptions options = MakeOptions(args);
  std::printf("rpa demo: a serving loop over %d layers of %lld q heads, %lld kv heads, head_dim "
              "%lld, page_size %lld, q %s, kv %s\n",
              shape.layers, static_cast<long long>(shape.num_q_heads),
              static_cast<long long>(shape.num_kv_heads), static_cast<long long>(shape.head_dim),
              static_cast<long long>(shape.page_size), Name(shape.q_dtype).c_str(),
              Name(shape.kv_dtype).c_str());
  PrintThreads(args);
  std::printf("traffic: %d requests (%d at step 0, then %.2f a step), prompts %d-%d tokens, "
              "outputs %d-%d; %d tokens a step, at most %d running; KV cache %d pages of %lld "
              "tokens a layer (%.0f MiB in all)\n",
              args.stream.num_requests, args.stream.initial, args.stream.arrivals_per_step,
              args.stream.min_prompt, args.stream.max_prompt, args.stream.min_output,
              args.stream.max_output, args.limits.token_budget, args.limits.max_running,
              args.num_pages, static_cast<long long>(shape.page_size),
              static_cast<double>(shape.PageElements()) * SizeOf(shape.kv_dtype) * args.num_pages *
                  shape.layers / (1 << 20));

  // The machine is measured before and after the runs; each limit is the
  // higher of the two (a neighbour busy during one only lowers it).
  std::optional<MachineLimits> limits;
  if (!args.skip_machine) limits = testing::MeasureMachine(args.threads, /*quick=*/true);

  const PerCallResult per_call = RunPerCall(args, shape, options);
  ProgressLine progress;
  const LoopResult loop = RunServingLoop(MakeLoopConfig(args, shape, options),
                                         [&](const LoopProgress& p) { progress.Show(p); });
  progress.End();

  PrintLoop(loop, shape);
  if (limits) {
    limits = testing::HigherLimits(*limits, testing::MeasureMachine(args.threads, /*quick=*/true));
    PrintSpeed(loop, per_call, *limits, shape.kv_dtype);
  }
  const bool verified = PrintChecks(loop, per_call, shape, args.check_rows);
  const bool plotted = args.plot.empty() || WritePlot(args.plot, loop, shape);
  return verified && plotted ? 0 : 1;
}

}  // namespace

void AddDemoCommand(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* demo = app.add_subcommand(
      "demo", "Run a short continuous-batching serving loop, verify sampled steps against the "
              "reference, time it");
  // The model.
  demo->add_option("--layers", args->shape.layers, "Attention layers run per step")->capture_default_str();
  demo->add_option("--num-q-heads", args->shape.num_q_heads, "Query heads")->capture_default_str();
  demo->add_option("--num-kv-heads", args->shape.num_kv_heads, "KV heads (GQA groups)")->capture_default_str();
  demo->add_option("--head-dim", args->shape.head_dim, "Head dimension")->capture_default_str();
  demo->add_option("--page-size", args->shape.page_size, "Tokens per KV-cache page")->capture_default_str();
  demo->add_option("--q-dtype", args->q_dtype, "Query dtype: f32, bf16, f16")->capture_default_str();
  demo->add_option("--kv-dtype", args->kv_dtype,
                   "KV dtype: f32, bf16, f16, fp8_e4m3, fp8_e5m2, int8")->capture_default_str();
  // Traffic and engine.
  demo->add_option("--requests", args->stream.num_requests, "Requests in the stream")->capture_default_str();
  demo->add_option("--initial-requests", args->stream.initial, "Requests arriving at step 0")->capture_default_str();
  demo->add_option("--arrival-rate", args->stream.arrivals_per_step, "Later arrivals per step (Poisson)")->capture_default_str();
  demo->add_option("--min-prompt", args->stream.min_prompt, "Shortest prompt (log-uniform)")->capture_default_str();
  demo->add_option("--max-prompt", args->stream.max_prompt, "Longest prompt")->capture_default_str();
  demo->add_option("--min-output", args->stream.min_output, "Fewest output tokens (uniform)")->capture_default_str();
  demo->add_option("--max-output", args->stream.max_output, "Most output tokens")->capture_default_str();
  demo->add_option("--token-budget", args->limits.token_budget,
                   "Query tokens per step (chunked prefill fills it)")->capture_default_str();
  demo->add_option("--max-running", args->limits.max_running, "Sequences per step")->capture_default_str();
  demo->add_option("--num-pages", args->num_pages, "KV-cache pages per layer")->capture_default_str();
  demo->add_option("--steps", args->steps, "Stop after this many steps (0: when every request is done)")->capture_default_str();
  demo->add_option("--check-every", args->check_every, "Check every n-th step against the reference")->capture_default_str();
  demo->add_option("--check-rows", args->check_rows,
                   "Query rows checked at each end of every sequence")->capture_default_str();
  // The per-call step.
  demo->add_option("--decode", args->decode, "Per-call step: decode sequences (1 new token each)")->capture_default_str();
  demo->add_option("--chunked", args->chunked, "Per-call step: chunked-prefill sequences")->capture_default_str();
  demo->add_option("--chunk", args->chunk, "Per-call step: new tokens per chunked-prefill sequence")->capture_default_str();
  demo->add_option("--prefill", args->prefill, "Per-call step: full-prefill sequences")->capture_default_str();
  demo->add_option("--prefill-len", args->prefill_len, "Per-call step: tokens per full prefill")->capture_default_str();
  demo->add_option("--max-kv-len", args->max_kv_len,
                   "Per-call step: longest history of a decode or chunked sequence")->capture_default_str();
  demo->add_option("--iterations", args->iterations, "Per-call step: timed calls (the median is printed)")->capture_default_str();
  // The run.
  demo->add_option("--threads", args->threads,
                   "Worker threads (0: RPA_NUM_THREADS, else the process's CPUs)")->capture_default_str();
  demo->add_option("--seed", args->seed, "Random seed")->capture_default_str();
  demo->add_flag("--skip-machine", args->skip_machine,
                 "Do not measure this machine (no roofline figures; for quick tests)");
  demo->add_option("--plot", args->plot, "Write step time and tokens per step to this PNG file");
  demo->callback([args] {
    const int status = RunDemo(*args);
    if (status != 0) throw CLI::RuntimeError(status);
  });
}

}  // namespace rpa::tools
