// `rpa bench`: this machine's limits and the kernel's speed, measured in one
// run (docs/contract.md §5, issue 3).
//
// Limits: testing/machine.h (streaming read bandwidth, f32 FMA and bf16 dot
// peaks, on one thread and on all threads).
//
// Workloads run on K/V larger than the last-level cache: one batch is built,
// its pages copied `copies` times into a huge-page buffer, and successive
// calls rotate through the copies, so every call reads its K/V from memory.
// Each reports the median time, tokens/s, GB/s of unique K/V bytes,
// GFLOP/s (q.k and p.v over visible keys: 4 * head_dim per (row, key, q
// head)), frac_of_limit = roofline time / measured time with roofline time =
// max(bytes / bandwidth, FLOPs / peak of the fastest arithmetic for the K/V
// dtype), and speedup_vs_naive against a single-threaded gather + unfused
// QK^T, softmax, PV run in the same process; prefill and mixed also report
// speedup_vs_onednn against testing/onednn_peer.h (oneDNN's bf16 matmuls and
// a plain softmax, gather included) on the same thread count. The layers
// workload (RunLayers) runs one step over 32 layers planned once against one
// call per layer.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_mla.h"
#include "commands.h"
#include "rpa/rpa.h"
#include "testing/machine.h"
#include "testing/onednn_peer.h"
#include "testing/synthetic_batch.h"
#include "testing/without_amx.h"
#include "testing/workloads.h"

namespace rpa::tools {
namespace {

using testing::BatchSpec;
using testing::CountWork;
using testing::DecodeLongSequences;
using testing::DecodeSequences;
using testing::HigherLimits;
using testing::HugeBuffer;
using testing::MachineLimits;
using testing::MakeSyntheticBatch;
using testing::MeasureMachine;
using testing::MixedSequences;
using testing::PrefillSequences;
using testing::SequenceShape;
using testing::SyntheticBatch;
using testing::VerifySequences;
using testing::WorkCount;

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct BenchArgs {
  bool json = false;
  bool quick = false;
  bool hot = false;
  std::vector<std::string> only;
  int threads = 0;  // 0: all cores.
};

volatile uint64_t g_sink = 0;

// ---------------------------------------------------------------- workloads

struct Workload {
  std::string name;
  std::vector<SequenceShape> sequences;
  DType kv_dtype = DType::kBF16;
  double kv_scale = 0.0;  // > 0: k_scale = v_scale = this (quantized K/V).
};

// The workloads (testing/workloads.h); all with 32 q heads, 8 kv
// heads, head_dim 128, page_size 16, bf16 q, pages in random order; bf16
// K/V except decode-fp8 (the decode shape on fp8 e4m3fn K/V with scales:
// half the bytes of decode), decode-int8 (the same on int8 K/V, scales 1/32)
// and decode-f16 (the decode shape on f16 K/V, the cache dtype of llama.cpp
// and of vLLM for fp16 models); verify-fp8 is verify on fp8 e4m3fn K/V
// (speculative decoding over vLLM's fp8 cache).
std::vector<Workload> Workloads() {
  return {
      {"decode", DecodeSequences()},
      {"decode-fp8", DecodeSequences(), DType::kF8E4M3FN, 0.5},
      {"decode-int8", DecodeSequences(), DType::kI8, 1.0 / 32},
      {"decode-f16", DecodeSequences(), DType::kF16},
      {"decode-long", DecodeLongSequences()},
      {"verify", VerifySequences()},
      {"verify-fp8", VerifySequences(), DType::kF8E4M3FN, 0.5},
      {"prefill", PrefillSequences(2048)},
      {"mixed", MixedSequences()},
  };
}

// The simplest correct alternative: per sequence, gather K and V into dense
// f32 arrays, then for each query row and head an unfused loop: all logits,
// softmax, weighted sum. Single-threaded, no tiling, no SIMD by hand. Only
// query rows with index % sample == 0 are computed (the gather is always
// whole); the compute time is scaled by total / sampled FLOPs.
double NaiveSeconds(const SyntheticBatch& b, int sample, double sm_scale) {
  const BatchSpec& spec = b.spec;
  const int64_t H = spec.num_q_heads, KH = spec.num_kv_heads, D = spec.head_dim;
  const int64_t G = H / KH;
  const int64_t row = 2 * KH * D;
  double gather_s = 0, compute_s = 0, sampled_flops = 0, total_flops = 0;
  std::vector<float> k, v, q(static_cast<size_t>(D)), logits, out(static_cast<size_t>(D));
  int64_t row_index = 0;
  for (int32_t seq = 0; seq < b.num_seqs[0]; ++seq) {
    const int64_t kv_len = b.kv_lens[seq];
    const int64_t q0 = b.cu_q_lens[seq], q_len = b.cu_q_lens[seq + 1] - q0;
    const int64_t pages_per_seq = static_cast<int64_t>(b.page_indices.size()) /
                                  static_cast<int64_t>(b.kv_lens.size());
    auto t0 = Clock::now();
    k.resize(static_cast<size_t>(kv_len * KH * D));
    v.resize(k.size());
    for (int64_t t = 0; t < kv_len; ++t) {
      const int64_t page = b.page_indices[seq * pages_per_seq + t / spec.page_size];
      const int64_t base = (page * spec.page_size + t % spec.page_size) * row;
      for (int64_t h = 0; h < KH; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          k[(t * KH + h) * D + d] = LoadAsF32(spec.kv_dtype, b.kv_pages.data(), base + 2 * h * D + d);
          v[(t * KH + h) * D + d] =
              LoadAsF32(spec.kv_dtype, b.kv_pages.data(), base + (2 * h + 1) * D + d);
        }
      }
    }
    auto t1 = Clock::now();
    gather_s += Seconds(t0, t1);
    logits.resize(static_cast<size_t>(kv_len));
    for (int64_t j = 0; j < q_len; ++j, ++row_index) {
      const int64_t pos = kv_len - q_len + j;
      const double row_flops = static_cast<double>(pos + 1) * H * 4.0 * D;
      total_flops += row_flops;
      if (row_index % sample != 0) continue;
      sampled_flops += row_flops;
      t0 = Clock::now();
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kh = h / G;
        for (int64_t d = 0; d < D; ++d) {
          q[d] = LoadAsF32(spec.q_dtype, b.q.data(), ((q0 + j) * H + h) * D + d);
        }
        float max_logit = -INFINITY;
        for (int64_t t = 0; t <= pos; ++t) {
          float dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[d] * k[(t * KH + kh) * D + d];
          logits[t] = dot * static_cast<float>(sm_scale);
          max_logit = std::max(max_logit, logits[t]);
        }
        float sum = 0;
        for (int64_t t = 0; t <= pos; ++t) {
          logits[t] = std::exp(logits[t] - max_logit);
          sum += logits[t];
        }
        std::fill(out.begin(), out.end(), 0.0f);
        for (int64_t t = 0; t <= pos; ++t) {
          const float w = logits[t] / sum;
          for (int64_t d = 0; d < D; ++d) out[d] += w * v[(t * KH + kh) * D + d];
        }
        g_sink = g_sink + static_cast<uint64_t>(out[0] != out[0]);
      }
      compute_s += Seconds(t0, Clock::now());
    }
  }
  return gather_s + (sampled_flops > 0 ? compute_s * total_flops / sampled_flops : 0.0);
}

struct Result {
  std::string name;
  int threads = 1;
  double ms = 0, tokens_per_s = 0, gbs = 0, gflops = 0, roofline_ms = 0, frac = 0;
  double naive_ms = 0, speedup = 0;
  double hot_ms = 0;  // --hot: every page index 0, K/V in the core's caches.
  // testing/onednn_peer.h on the same thread count; onednn_peer: the
  // workload is one it runs (prefill, mixed); onednn_ms < 0: not built.
  bool onednn_peer = false;
  double onednn_ms = -1, onednn_max_abs_diff = 0, onednn_tolerance_ratio = 0;
  testing::OnednnPeerPhases onednn_phases;  // Each phase's median over the timed calls.
  std::string onednn_impl;
  const char* bound = "";
  int copies = 0, reps = 0, naive_sample = 1;
  double kv_bytes = 0, flops = 0;
  bool all_threads = false;
  DType kv_dtype = DType::kBF16;
  std::string path;
  // The layers workload (RunLayers): layers per step, the one-call step's
  // median, their ratio, the per-layer difference and one Plan alone.
  int layers = 0;
  double one_call_ms = 0, min_ms = 0, one_call_min_ms = 0, speedup_vs_one_call = 0;
  double per_layer_overhead_us = 0, plan_us = 0;
  // The same workload with AMX hidden from dispatch (the best path without
  // it), where the call ran an AMX kernel; 0: it did not.
  double no_amx_ms = 0;
};

// Roofline, bound and frac_of_limit of r against `limits`.
void ApplyLimits(const MachineLimits& limits, Result& r) {
  const double memory_s = r.kv_bytes / (limits.read_gbs[r.all_threads ? 1 : 0] * 1e9);
  r.roofline_ms = limits.RooflineSeconds(r.flops, r.kv_bytes, r.kv_dtype, r.all_threads) * 1e3;
  r.bound = memory_s * 1e3 >= r.roofline_ms ? "memory" : "compute";
  r.frac = r.roofline_ms / r.ms;
}

// The kernels a call on this batch runs, as its plan names them.
std::string KernelsOf(const SyntheticBatch& batch, const TensorView& kv_pages,
                      const AttentionOptions& options) {
  AttentionPlan plan;
  plan.Plan(ShapeOf(batch.Q(), kv_pages),
            PageTable{batch.KvLens(), batch.PageIndices(), batch.CuQLens(), batch.NumSeqs()}, options);
  return plan.DescribeKernels();
}

void Progress(const std::string& line) {
  std::fprintf(stderr, "\r\033[K%s", line.c_str());
  std::fflush(stderr);
}

// ---- mla-decode (tools/bench_mla.h): its rows as Results, against the bf16
// roofline (bf16 latents: the bf16 dot peak where it beats the FMA's).
std::vector<Result> RunMlaDecodeWorkload(int all_threads, const BenchArgs& args, int index,
                                         int total) {
  std::vector<Result> results;
  const std::string label = "[" + std::to_string(index) + "/" + std::to_string(total) + "] ";
  for (const MlaDecodeRow& m :
       RunMlaDecode(all_threads, args.quick, [&](const std::string& s) { Progress(label + s); })) {
    Result r;
    r.name = m.name;
    r.threads = m.threads;
    r.all_threads = m.threads > 1;
    r.ms = m.ms;
    r.reps = m.reps;
    r.copies = 1;  // 151 MB of latents: beyond the LLC already.
    r.flops = m.flops;
    r.kv_bytes = m.latent_bytes;
    r.kv_dtype = DType::kBF16;
    r.tokens_per_s = m.tokens_per_s;
    r.gbs = m.latent_bytes / (m.ms * 1e-3) * 1e-9;
    r.gflops = m.flops / (m.ms * 1e-3) * 1e-9;
    r.path = m.path;
    r.onednn_peer = true;
    r.onednn_ms = m.onednn_ms;
    r.onednn_max_abs_diff = m.onednn_max_abs_diff;
    r.onednn_impl = m.onednn_impl;
    results.push_back(r);
  }
  return results;
}

std::vector<Result> RunWorkload(const Workload& w, const MachineLimits& limits, int all_threads,
                                const BenchArgs& args, int index, int total) {
  const bool quick = args.quick;
  BatchSpec spec;
  spec.num_q_heads = 32;
  spec.num_kv_heads = 8;
  spec.head_dim = 128;
  spec.page_size = 16;
  spec.q_dtype = DType::kBF16;
  spec.kv_dtype = w.kv_dtype;
  spec.sequences = w.sequences;
  spec.seed = 7;
  Progress("[" + std::to_string(index) + "/" + std::to_string(total) + "] " + w.name +
           ": building the batch");
  const SyntheticBatch batch = MakeSyntheticBatch(spec);
  const WorkCount work = CountWork(spec);
  const double flops = work.flops;
  const double kv_bytes = work.kv_bytes;

  // Enough copies of the cache that the working set is twice the LLC.
  const size_t cache_bytes = batch.kv_pages.size();
  const int copies = static_cast<int>(std::max<int64_t>(
      2, (2 * limits.llc_bytes + static_cast<int64_t>(cache_bytes) - 1) /
             static_cast<int64_t>(cache_bytes)));
  const size_t stride = (cache_bytes + 4096 + 4095) / 4096 * 4096;
  HugeBuffer pages(stride * static_cast<size_t>(copies));
  for (int c = 0; c < copies; ++c) {
    std::memcpy(pages.data + stride * c, batch.kv_pages.data(), cache_bytes);
  }
  const TensorView kv_view = batch.KvPages();
  std::vector<uint8_t> out = batch.NewOutput();
  AttentionOptions options;
  options.sm_scale = 1.0 / std::sqrt(static_cast<double>(spec.head_dim));
  if (w.kv_scale > 0) options.k_scale = options.v_scale = w.kv_scale;

  std::vector<Result> results;
  const int counts[2] = {1, all_threads};
  for (int ti = 0; ti < (all_threads > 1 ? 2 : 1); ++ti) {
    const int threads = counts[ti];
    options.num_threads = threads;
    Progress("[" + std::to_string(index) + "/" + std::to_string(total) + "] " + w.name +
             " threads=" + std::to_string(threads));
    // Reps: at least every copy once and about 0.3 s (quick) / 1 s of calls.
    int copy = 0;
    auto call = [&] {
      const TensorView view(pages.data + stride * copy, spec.kv_dtype,
                            {kv_view.shape[0], kv_view.shape[1], kv_view.shape[2],
                             kv_view.shape[3]});
      copy = (copy + 1) % copies;
      RaggedPagedAttention(
          batch.Q(), view,
          PageTable{batch.KvLens(), batch.PageIndices(), batch.CuQLens(), batch.NumSeqs()}, options,
          batch.OutView(out));
    };
    for (int i = 0; i < std::min(copies, 3); ++i) call();  // Warm up: threads, scratch.
    std::vector<double> times;
    auto time_calls = [&](const auto& fn) {
      times.clear();
      const double budget = quick ? 0.3 : 1.5;
      const auto start = Clock::now();
      while (times.size() < static_cast<size_t>(quick ? 5 : 11) ||
             (Seconds(start, Clock::now()) < budget && times.size() < 400)) {
        const auto t0 = Clock::now();
        fn();
        times.push_back(Seconds(t0, Clock::now()));
      }
      return Median(times);
    };
    // --hot: the same call with every page index 0, so K/V come from the
    // caches: the kernel's time without memory, i.e. its arithmetic.
    double hot_s = 0;
    if (args.hot) {
      const std::vector<int32_t> page_zero(batch.page_indices.size(), 0);
      const TensorView pages_view = batch.PageIndices();
      const TensorView hot_pages(page_zero.data(), DType::kI32,
                                 {pages_view.shape[0], pages_view.shape[1]});
      hot_s = time_calls([&] {
        RaggedPagedAttention(batch.Q(), kv_view,
                             PageTable{batch.KvLens(), hot_pages, batch.CuQLens(), batch.NumSeqs()},
                             options, batch.OutView(out));
      });
    }
    const double s = time_calls(call);
    Result r;
    r.name = w.name;
    r.threads = threads;
    r.copies = copies;
    r.reps = static_cast<int>(times.size());
    r.flops = flops;
    r.kv_bytes = kv_bytes;
    r.ms = s * 1e3;
    r.hot_ms = hot_s * 1e3;
    r.tokens_per_s = batch.TotalQTokens() / s;
    r.gbs = kv_bytes / s * 1e-9;
    r.gflops = flops / s * 1e-9;
    r.all_threads = ti == 1;
    r.kv_dtype = spec.kv_dtype;
    r.path = KernelsOf(batch, kv_view, options);
    if (r.path.find("amx") != std::string::npos) {
      const testing::ScopedWithoutAmx hide_amx;
      call();  // Warm up the other path's scratch.
      r.no_amx_ms = time_calls(call) * 1e3;
    }
    // The oneDNN peer (testing/onednn_peer.h), checked against this run's
    // output on the same batch, then timed on the same rotating copies.
    r.onednn_peer = w.name == "prefill" || w.name == "mixed";
    if (r.onednn_peer && testing::GetOnednnPeerInfo().available) {
      Progress("[" + std::to_string(index) + "/" + std::to_string(total) + "] " + w.name +
               " threads=" + std::to_string(threads) + ": oneDNN peer");
      testing::OnednnPeer peer(batch, threads, options.sm_scale);
      std::vector<uint8_t> peer_out = batch.NewOutput();
      peer.Run(batch.kv_pages.data(), peer_out.data());
      // Within 2e-2 plus one bf16 ulp of rpa's value (both outputs are
      // rounded to bf16; a 1-ulp disagreement at |o| >= 4 is 0.031).
      r.onednn_max_abs_diff = testing::MaxAbsDifference(batch, peer_out, out);
      r.onednn_tolerance_ratio = testing::ToleranceRatio(batch, peer_out, out, 2e-2);
      if (!(r.onednn_tolerance_ratio <= 1.0)) {
        throw std::runtime_error(
            "the oneDNN peer disagrees with rpa on " + w.name + " (threads=" +
            std::to_string(threads) + "): max abs difference " +
            std::to_string(r.onednn_max_abs_diff) + ", " +
            std::to_string(r.onednn_tolerance_ratio) + "x the bound 2e-2 + 1 bf16 ulp");
      }
      peer.ClearPhases();
      int peer_copy = 0;
      r.onednn_ms = time_calls([&] {
                      peer.Run(pages.data + stride * peer_copy, peer_out.data());
                      peer_copy = (peer_copy + 1) % copies;
                    }) * 1e3;
      r.onednn_impl = peer.MatmulImpl();
      auto phase_median = [&](double testing::OnednnPeerPhases::*phase) {
        std::vector<double> v;
        for (const testing::OnednnPeerPhases& p : peer.Phases()) v.push_back(p.*phase);
        return Median(v);
      };
      r.onednn_phases.gather_s = phase_median(&testing::OnednnPeerPhases::gather_s);
      r.onednn_phases.qk_s = phase_median(&testing::OnednnPeerPhases::qk_s);
      r.onednn_phases.softmax_s = phase_median(&testing::OnednnPeerPhases::softmax_s);
      r.onednn_phases.pv_s = phase_median(&testing::OnednnPeerPhases::pv_s);
      r.onednn_phases.write_s = phase_median(&testing::OnednnPeerPhases::write_s);
    }
    results.push_back(r);
  }
  Progress("[" + std::to_string(index) + "/" + std::to_string(total) + "] " + w.name +
           ": naive baseline");
  // The naive baseline computes every row for small batches and a sample of
  // rows (all of the gather) for large ones.
  const int sample = flops > 4e9 ? (quick ? 64 : 16) : flops > 5e8 ? (quick ? 8 : 2) : 1;
  const double naive_s = NaiveSeconds(batch, sample, options.sm_scale);
  for (Result& r : results) {
    r.naive_ms = naive_s * 1e3;
    r.naive_sample = sample;
    r.speedup = r.naive_ms / r.ms;
  }
  return results;
}

// ---------------------------------------------------------------- layers

// One serving step as an engine runs it: the mixed batch over kLayers
// layers, each with its own cache (the rotating copies), planned once
// (AttentionPlan) and run per layer, against the one-call function per
// layer, alternating in the same run. ms and one_call_ms are medians of
// whole steps, min_ms and one_call_min_ms their minima; speedup_vs_one_call
// and per_layer_overhead_us ((one-call step - plan step) / kLayers) come
// from the minima, the steps least disturbed by other work on the machine;
// plan_us is the median of one Plan alone, the work every one call repeats.
// No naive baseline (it would take minutes).
constexpr int kLayers = 32;

std::vector<Result> RunLayers(const MachineLimits& limits, int all_threads, const BenchArgs& args,
                              int index, int total) {
  BatchSpec spec;
  spec.num_q_heads = 32;
  spec.num_kv_heads = 8;
  spec.head_dim = 128;
  spec.page_size = 16;
  spec.sequences = MixedSequences();
  spec.seed = 7;
  const std::string label = "[" + std::to_string(index) + "/" + std::to_string(total) + "] layers";
  Progress(label + ": building the batch");
  const SyntheticBatch batch = MakeSyntheticBatch(spec);
  const WorkCount work = CountWork(spec);
  // Layer l reads copy l % copies: enough distinct caches for twice the LLC.
  const size_t cache_bytes = batch.kv_pages.size();
  const size_t stride = (cache_bytes + 4096 + 4095) / 4096 * 4096;
  const int copies = static_cast<int>(std::clamp<int64_t>(
      2 * limits.llc_bytes / static_cast<int64_t>(cache_bytes) + 1, 2, kLayers));
  HugeBuffer caches(stride * static_cast<size_t>(copies));
  for (int c = 0; c < copies; ++c) {
    std::memcpy(caches.data + stride * c, batch.kv_pages.data(), cache_bytes);
  }
  const TensorView kv = batch.KvPages();
  auto layer_cache = [&](int layer) {
    return TensorView(caches.data + stride * (layer % copies), spec.kv_dtype,
                      {kv.shape[0], kv.shape[1], kv.shape[2], kv.shape[3]});
  };
  const PageTable table{batch.KvLens(), batch.PageIndices(), batch.CuQLens(), batch.NumSeqs()};
  std::vector<uint8_t> out = batch.NewOutput();
  AttentionOptions options;
  options.sm_scale = 1.0 / std::sqrt(static_cast<double>(spec.head_dim));

  std::vector<Result> results;
  const int counts[2] = {1, all_threads};
  for (int ti = 0; ti < (all_threads > 1 ? 2 : 1); ++ti) {
    options.num_threads = counts[ti];
    Progress(label + " threads=" + std::to_string(counts[ti]));
    AttentionPlan plan;
    auto planned_step = [&] {
      plan.Plan(ShapeOf(batch.Q(), kv), table, options);
      for (int l = 0; l < kLayers; ++l) plan.Run(batch.Q(), layer_cache(l), batch.OutView(out));
    };
    auto one_call_step = [&] {
      for (int l = 0; l < kLayers; ++l) {
        RaggedPagedAttention(batch.Q(), layer_cache(l), table, options, batch.OutView(out));
      }
    };
    planned_step();  // Warm up: threads, scratch, the thread's one-call state.
    one_call_step();
    std::vector<double> planned, one_call;
    const int reps = args.quick ? 3 : 5;
    for (int rep = 0; rep < reps; ++rep) {
      // Alternating which goes first cancels a drift of the machine's speed.
      double t[2];
      for (int k = 0; k < 2; ++k) {
        const bool plan_now = (rep + k) % 2 == 0;
        const auto t0 = Clock::now();
        if (plan_now) {
          planned_step();
        } else {
          one_call_step();
        }
        t[plan_now ? 0 : 1] = Seconds(t0, Clock::now());
      }
      planned.push_back(t[0]);
      one_call.push_back(t[1]);
    }
    std::vector<double> plan_alone;
    for (int i = 0; i < 101; ++i) {
      const auto t0 = Clock::now();
      plan.Plan(ShapeOf(batch.Q(), kv), table, options);
      plan_alone.push_back(Seconds(t0, Clock::now()));
    }
    Result r;
    r.name = "layers";
    r.threads = counts[ti];
    r.layers = kLayers;
    r.copies = copies;
    r.reps = reps;
    r.flops = work.flops * kLayers;
    r.kv_bytes = work.kv_bytes * kLayers;
    r.ms = Median(planned) * 1e3;
    r.one_call_ms = Median(one_call) * 1e3;
    r.min_ms = *std::min_element(planned.begin(), planned.end()) * 1e3;
    r.one_call_min_ms = *std::min_element(one_call.begin(), one_call.end()) * 1e3;
    r.speedup_vs_one_call = r.one_call_min_ms / r.min_ms;
    r.per_layer_overhead_us = (r.one_call_min_ms - r.min_ms) / kLayers * 1e3;
    r.plan_us = Median(plan_alone) * 1e6;
    r.tokens_per_s = batch.TotalQTokens() / (r.ms * 1e-3);
    r.gbs = r.kv_bytes / (r.ms * 1e-3) * 1e-9;
    r.gflops = r.flops / (r.ms * 1e-3) * 1e-9;
    r.all_threads = ti == 1;
    r.kv_dtype = spec.kv_dtype;
    r.path = plan.DescribeKernels();
    results.push_back(r);
  }
  return results;
}

void PrintJson(const MachineLimits& limits, int threads, const std::vector<Result>& results) {
  const CpuInfo& cpu = ThisCpuInfo();
  std::printf("{\"machine\": {\"cpu\": {\"model_name\": \"%s\", \"vendor\": \"%s\", "
              "\"family\": %d, \"model\": %d, \"features\": \"%s\"}, ",
              cpu.model_name.c_str(), cpu.vendor.c_str(), cpu.family, cpu.model,
              cpu.features.c_str());
  std::printf("\"threads\": %d, \"llc_bytes\": %lld, "
              "\"read_gbs_1_thread\": %.2f, \"read_gbs_all_threads\": %.2f, "
              "\"fma_f32_gflops_1_thread\": %.1f, \"fma_f32_gflops_all_threads\": %.1f, "
              "\"bf16_dot_gflops_1_thread\": %.1f, \"bf16_dot_gflops_all_threads\": %.1f, "
              "\"fma_f16_gflops_1_thread\": %.1f, \"fma_f16_gflops_all_threads\": %.1f, "
              "\"amx_bf16_gflops_1_thread\": %.1f, \"amx_bf16_gflops_all_threads\": %.1f, "
              "\"avx512_bf16\": %s, \"avx512_fp16\": %s, \"amx\": \"%s\", ",
              threads, static_cast<long long>(limits.llc_bytes), limits.read_gbs[0],
              limits.read_gbs[1], limits.fma_f32_gflops[0], limits.fma_f32_gflops[1],
              limits.bf16_dot_gflops[0], limits.bf16_dot_gflops[1], limits.fma_f16_gflops[0],
              limits.fma_f16_gflops[1], limits.amx_bf16_gflops[0], limits.amx_bf16_gflops[1],
              limits.avx512_bf16 ? "true" : "false", limits.avx512_fp16 ? "true" : "false",
              limits.amx.c_str());
  const testing::OnednnPeerInfo onednn = testing::GetOnednnPeerInfo();
  if (onednn.available) {
    std::printf("\"onednn_isa\": \"%s\", \"onednn_version\": \"%s\", \"onednn_threading\": \"%s\"",
                onednn.isa.c_str(), onednn.version.c_str(), onednn.threading.c_str());
  } else {
    std::printf("\"onednn_isa\": null, \"onednn\": \"%s\"", onednn.reason.c_str());
  }
  std::printf("},\n \"workloads\": [");
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::printf("%s\n  {\"name\": \"%s\", \"threads\": %d, \"ms\": %.4f, \"frac_of_limit\": %.3f, "
                "\"speedup_vs_naive\": %.1f, \"tokens_per_s\": %.1f, \"kv_gbs\": %.2f, "
                "\"gflops\": %.1f, \"roofline_ms\": %.4f, \"bound\": \"%s\", \"naive_ms\": %.2f, "
                "\"naive_row_sample\": %d, \"kv_bytes\": %.0f, \"flops\": %.0f, "
                "\"kv_copies\": %d, \"reps\": %d, \"path\": \"%s\"",
                i ? "," : "", r.name.c_str(), r.threads, r.ms, r.frac, r.speedup,
                r.tokens_per_s, r.gbs, r.gflops, r.roofline_ms, r.bound, r.naive_ms,
                r.naive_sample, r.kv_bytes, r.flops, r.copies, r.reps, r.path.c_str());
    if (r.hot_ms > 0) std::printf(", \"hot_ms\": %.4f", r.hot_ms);
    if (r.layers > 0) {
      std::printf(", \"layers\": %d, \"one_call_ms\": %.4f, \"min_ms\": %.4f, "
                  "\"one_call_min_ms\": %.4f, \"speedup_vs_one_call\": %.4f, "
                  "\"per_layer_overhead_us\": %.2f, \"plan_us\": %.2f",
                  r.layers, r.one_call_ms, r.min_ms, r.one_call_min_ms, r.speedup_vs_one_call,
                  r.per_layer_overhead_us, r.plan_us);
    }
    // null where the call ran no AMX kernel ("machine"."amx" says why).
    if (r.no_amx_ms > 0) {
      std::printf(", \"no_amx_ms\": %.4f, \"speedup_vs_no_amx\": %.2f", r.no_amx_ms,
                  r.no_amx_ms / r.ms);
    } else {
      std::printf(", \"speedup_vs_no_amx\": null");
    }
    if (r.onednn_peer && r.onednn_ms >= 0) {
      const testing::OnednnPeerPhases& p = r.onednn_phases;
      const double ms = 1e3;
      std::printf(", \"onednn_ms\": %.4f, \"speedup_vs_onednn\": %.2f, "
                  "\"onednn_max_abs_diff\": %.5f, \"onednn_impl\": \"%s\", "
                  "\"onednn_phases_ms\": {\"gather\": %.3f, \"qk\": %.3f, \"softmax\": %.3f, "
                  "\"pv\": %.3f, \"write\": %.3f}",
                  r.onednn_ms, r.onednn_ms / r.ms, r.onednn_max_abs_diff, r.onednn_impl.c_str(),
                  p.gather_s * ms, p.qk_s * ms, p.softmax_s * ms,
                  p.pv_s * ms, p.write_s * ms);
    } else if (r.onednn_peer) {
      std::printf(", \"onednn_ms\": null, \"speedup_vs_onednn\": null");
    }
    std::printf("}");
  }
  std::printf("\n]}\n");
}

void PrintTable(const MachineLimits& limits, int threads, const std::vector<Result>& results) {
  std::printf("machine: %d threads, LLC %.0f MiB\n", threads, limits.llc_bytes / 1048576.0);
  std::printf("  read bandwidth   %7.1f GB/s (1 thread)  %7.1f GB/s (%d threads)\n",
              limits.read_gbs[0], limits.read_gbs[1], threads);
  std::printf("  f32 FMA peak     %7.1f GFLOP/s          %7.1f GFLOP/s\n",
              limits.fma_f32_gflops[0], limits.fma_f32_gflops[1]);
  if (limits.bf16_dot_gflops[0] > 0) {
    std::printf("  bf16 dot peak    %7.1f GFLOP/s          %7.1f GFLOP/s\n",
                limits.bf16_dot_gflops[0], limits.bf16_dot_gflops[1]);
  }
  if (limits.fma_f16_gflops[0] > 0) {
    std::printf("  f16 FMA peak     %7.1f GFLOP/s          %7.1f GFLOP/s\n",
                limits.fma_f16_gflops[0], limits.fma_f16_gflops[1]);
  }
  if (limits.amx_bf16_gflops[0] > 0) {
    std::printf("  AMX bf16 peak    %7.1f GFLOP/s          %7.1f GFLOP/s\n",
                limits.amx_bf16_gflops[0], limits.amx_bf16_gflops[1]);
  } else {
    std::printf("  AMX: %s\n", limits.amx.c_str());
  }
  std::printf("  (measured before and after the workloads, %.1f s in all; each figure the higher\n"
              "   of the two, each of those the best of several repetitions)\n",
              limits.seconds);
  const bool hot = !results.empty() && results[0].hot_ms > 0;
  std::printf("\n%-12s %3s %10s %12s %8s %9s %8s %7s %10s %8s%s %10s %9s\n", "workload", "thr",
              "ms", "tokens/s", "KV GB/s", "GFLOP/s", "bound", "frac", "naive ms", "speedup",
              hot ? "     hot ms" : "", "oneDNN ms", "vs oneDNN");
  for (const Result& r : results) {
    std::printf("%-12s %3d %10.3f %12.0f %8.1f %9.1f %8s %7.2f %10.1f %8.1f", r.name.c_str(),
                r.threads, r.ms, r.tokens_per_s, r.gbs, r.gflops, r.bound, r.frac, r.naive_ms,
                r.speedup);
    if (hot) std::printf(" %10.3f", r.hot_ms);
    if (r.onednn_peer && r.onednn_ms >= 0) {
      std::printf(" %10.3f %9.2f", r.onednn_ms, r.onednn_ms / r.ms);
    } else {
      std::printf(" %10s %9s", "-", "-");
    }
    std::printf("\n");
  }
  for (const Result& r : results) {
    if (r.layers == 0) continue;
    std::printf("layers (%d threads): %d layers planned once %.3f ms (min %.3f), one call each "
                "%.3f ms (min %.3f): speedup_vs_one_call %.4f, per_layer_overhead_us %.2f (from "
                "the minima), one Plan %.2f us\n",
                r.threads, r.layers, r.ms, r.min_ms, r.one_call_ms, r.one_call_min_ms,
                r.speedup_vs_one_call, r.per_layer_overhead_us, r.plan_us);
  }
  const testing::OnednnPeerInfo onednn = testing::GetOnednnPeerInfo();
  const bool any_peer =
      std::any_of(results.begin(), results.end(), [](const Result& r) { return r.onednn_peer; });
  if (any_peer && !onednn.available) {
    std::printf("\noneDNN peer: not run (%s)\n", onednn.reason.c_str());
  } else if (any_peer) {
    std::string impl;
    for (const Result& r : results) {
      if (!r.onednn_impl.empty()) impl = r.onednn_impl;
    }
    std::printf("\noneDNN peer (prefill, mixed, mla-decode): oneDNN %s, ISA %s, %s threads = rpa's, matmuls %s:\n"
                "  gather K/V/q to dense matmul inputs + QK^T (f32 out) + scale/mask/softmax (C++)\n"
                "  + PV per sequence and kv head, verified against rpa's output first\n",
                onednn.version.c_str(), onednn.isa.c_str(), onednn.threading.c_str(),
                impl.empty() ? "-" : impl.c_str());
  }
}

int RunBench(const BenchArgs& args) {
  const int threads = args.threads > 0 ? args.threads : DefaultNumThreads();
  std::vector<Workload> workloads;
  for (const Workload& w : Workloads()) {
    if (args.only.empty() || std::find(args.only.begin(), args.only.end(), w.name) != args.only.end()) {
      workloads.push_back(w);
    }
  }
  const bool layers =
      args.only.empty() || std::find(args.only.begin(), args.only.end(), "layers") != args.only.end();
  const bool mla = args.only.empty() ||
                   std::find(args.only.begin(), args.only.end(), "mla-decode") != args.only.end();
  const int total = static_cast<int>(workloads.size()) + (layers ? 1 : 0) + (mla ? 1 : 0) + 1;
  Progress("[0/" + std::to_string(total - 1) + "] measuring the machine's limits");
  MachineLimits limits = MeasureMachine(threads, args.quick);
  std::vector<Result> results;
  for (size_t i = 0; i < workloads.size(); ++i) {
    std::vector<Result> workload_results;
    try {
      workload_results = RunWorkload(workloads[i], limits, threads, args, static_cast<int>(i) + 1,
                                     total - 1);
    } catch (const std::exception& e) {  // The oneDNN peer disagreed: the bench fails.
      std::fprintf(stderr, "\r\033[Krpa bench: %s\n", e.what());
      return 1;
    }
    for (Result& r : workload_results) results.push_back(r);
  }
  if (layers) {
    const int index = static_cast<int>(workloads.size()) + 1;
    for (Result& r : RunLayers(limits, threads, args, index, total - 1)) results.push_back(r);
  }
  if (mla) {
    try {
      for (Result& r : RunMlaDecodeWorkload(threads, args, total - 1, total - 1)) {
        results.push_back(r);
      }
    } catch (const std::exception& e) {  // The oneDNN MLA peer disagreed: the bench fails.
      std::fprintf(stderr, "\r\033[Krpa bench: %s\n", e.what());
      return 1;
    }
  }
  // Measured again after the workloads, and each limit is the higher of the
  // two: on a shared host a neighbour can take a core or the memory bus
  // during one measurement, and a limit measured low would flatter every
  // frac_of_limit (even past 1).
  Progress("[" + std::to_string(total - 1) + "/" + std::to_string(total - 1) +
           "] measuring the machine's limits again");
  limits = HigherLimits(limits, MeasureMachine(threads, args.quick));
  for (Result& r : results) ApplyLimits(limits, r);
  Progress("");
  std::fprintf(stderr, "\r\033[K");
  if (args.json) {
    PrintJson(limits, threads, results);
  } else {
    PrintTable(limits, threads, results);
  }
  return 0;
}

}  // namespace

void AddBenchCommand(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* bench = app.add_subcommand(
      "bench", "Measure this machine's limits and the kernel against them and a naive baseline");
  bench->add_flag("--json", args->json, "Print one JSON object instead of a table");
  bench->add_flag("--quick", args->quick, "Fewer repetitions: the whole run in about a minute");
  bench->add_flag("--hot", args->hot,
                  "Also time each workload with every page index 0 (K/V in the caches): "
                  "the kernel without memory");
  bench->add_option("--only", args->only,
                    "Workloads to run: decode, decode-fp8, decode-int8, decode-f16, decode-long, "
                    "verify, verify-fp8, prefill, mixed, layers, mla-decode");
  bench->add_option("--threads", args->threads,
                    "Threads for the all-threads runs (0: RPA_NUM_THREADS or all cores)")
      ->capture_default_str();
  bench->callback([args] {
    const int status = RunBench(*args);
    if (status != 0) throw CLI::RuntimeError(status);
  });
}

}  // namespace rpa::tools
