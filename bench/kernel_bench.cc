// Google Benchmark for the kernel's parts: the bf16 dot inner loops on
// cache-resident tiles (compute throughput) and whole calls on K/V larger
// than the last-level cache (rotating copies), with bytes and FLOPs as rate
// counters. `rpa bench` is the end-to-end report against machine limits;
// this is for working on one piece.
#include <benchmark/benchmark.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "kernel/kernel.h"
#include "rpa/rpa.h"
#include "machine.h"
#include "synthetic_batch.h"

namespace rpa {
namespace {

using internal::CpuHasAvx512Bf16;

std::vector<uint16_t> RandomBf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = BF16FromF32(normal(rng)).bits;
  return v;
}

// QK^T of `rows` rows x 256 keys, head_dim 128, K in L1/L2.
void BM_Bf16Logits(benchmark::State& state) {
  if (!CpuHasAvx512Bf16()) {
    state.SkipWithError("no AVX-512 BF16");
    return;
  }
  const int64_t rows = state.range(0), tokens = 256, dim = 128;
  const std::vector<uint16_t> q = RandomBf16(rows * dim, 1), k = RandomBf16(tokens * dim, 2);
  std::vector<const void*> k_rows(tokens);
  for (int64_t t = 0; t < tokens; ++t) k_rows[t] = k.data() + t * dim;
  std::vector<float> s(rows * tokens);
  for (auto _ : state) {
    internal::Bf16Logits(q.data(), nullptr, dim, rows, k_rows.data(), tokens, dim, s.data(),
                         tokens);
    benchmark::DoNotOptimize(s.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * rows * tokens * dim * state.iterations(),
                                                benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Bf16Logits)->Arg(1)->Arg(4)->Arg(64);

// PV of `rows` rows x 256 keys, head_dim 128, V in L1/L2.
void BM_Bf16Pv(benchmark::State& state) {
  if (!CpuHasAvx512Bf16()) {
    state.SkipWithError("no AVX-512 BF16");
    return;
  }
  const int64_t rows = state.range(0), tokens = 256, dim = 128;
  const std::vector<uint16_t> v = RandomBf16(tokens * dim, 3);
  std::vector<const void*> v_rows(tokens);
  for (int64_t t = 0; t < tokens; ++t) v_rows[t] = v.data() + t * dim;
  std::vector<float> p(rows * tokens, 0.5f), acc(rows * dim, 0.0f);
  for (auto _ : state) {
    state.PauseTiming();
    std::fill(p.begin(), p.end(), 0.5f);  // Consumed by the call.
    state.ResumeTiming();
    internal::Bf16AccumulatePV(p.data(), tokens, rows, v_rows.data(), tokens, dim, acc.data(),
                               dim);
    benchmark::DoNotOptimize(acc.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * rows * tokens * dim * state.iterations(),
                                                benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Bf16Pv)->Arg(1)->Arg(4)->Arg(64);

// The widening path's QK^T and PV for decode's shape: 4 rows (q heads per
// kv head) x range(0) keys, head_dim 128, bf16 K/V rows 4 KiB apart as in a
// cache page (32 keys: L1; 512: L2). Per key and kv head.
void WideDecodeRows(benchmark::State& state, bool pv) {
  if (!internal::CpuHasAvx512Bw()) {
    state.SkipWithError("no AVX-512 BW");
    return;
  }
  const int64_t rows = 4, tokens = state.range(0), dim = 128, row_stride = state.range(1);
  const std::vector<uint16_t> kv = RandomBf16(tokens * row_stride, 2);
  std::vector<const void*> kv_rows(tokens);
  for (int64_t t = 0; t < tokens; ++t) kv_rows[t] = kv.data() + t * row_stride;
  std::vector<float> q(rows * dim, 0.01f), s(rows * tokens, 0.01f), acc(rows * dim, 0.0f);
  for (auto _ : state) {
    if (pv) {
      internal::WidePv(DType::kBF16, s.data(), tokens, rows, kv_rows.data(), tokens, dim,
                       acc.data(), dim, nullptr, 0, 0);
    } else {
      internal::WideLogits(DType::kBF16, q.data(), dim, rows, kv_rows.data(), tokens, dim,
                           s.data(), tokens, nullptr, 0, 0);
    }
    benchmark::DoNotOptimize(s.data());
    benchmark::DoNotOptimize(acc.data());
  }
  state.counters["ns_per_key"] = benchmark::Counter(
      static_cast<double>(tokens) * state.iterations(),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
void BM_WideLogits(benchmark::State& state) { WideDecodeRows(state, false); }
void BM_WidePv(benchmark::State& state) { WideDecodeRows(state, true); }
BENCHMARK(BM_WideLogits)->Args({32, 2048})->Args({512, 2048})->Args({32, 128})->Args({32, 160});
BENCHMARK(BM_WidePv)->Args({32, 2048})->Args({512, 2048})->Args({32, 128})->Args({32, 160});

// Whole decode calls (16 x kv 1024, 32/8 heads, bf16) on rotating copies of
// the cache adding up to 512 MiB; range(0) threads.
void BM_Decode(benchmark::State& state) {
  tools::BatchSpec spec;
  spec.sequences = std::vector<tools::SequenceShape>(16, {1, 1024});
  const tools::SyntheticBatch batch = tools::MakeSyntheticBatch(spec);
  const size_t bytes = batch.kv_pages.size();
  const int copies = static_cast<int>((size_t{512} << 20) / bytes + 1);
  // Huge pages, as rpa bench and a serving engine's cache would have: with
  // 4 KiB pages every K/V page's first touch is also a TLB miss.
  tools::HugeBuffer pages(bytes * copies);
  for (int c = 0; c < copies; ++c) std::memcpy(pages.data + bytes * c, batch.kv_pages.data(), bytes);
  const TensorView kv = batch.KvPages();
  std::vector<uint8_t> out = batch.NewOutput();
  AttentionOptions options;
  options.sm_scale = 1.0 / std::sqrt(128.0);
  options.num_threads = static_cast<int>(state.range(0));
  int copy = 0;
  for (auto _ : state) {
    const TensorView view(pages.data + bytes * copy, kv.dtype,
                          {kv.shape[0], kv.shape[1], kv.shape[2], kv.shape[3]});
    copy = (copy + 1) % copies;
    RaggedPagedAttention(batch.Q(), view, batch.KvLens(), batch.PageIndices(), batch.CuQLens(),
                         batch.NumSeqs(), options, batch.OutView(out));
  }
  const double kv_bytes = 16.0 * 1024 * 8 * 2 * 128 * 2;
  state.counters["KV_bytes/s"] =
      benchmark::Counter(kv_bytes * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["FLOP/s"] = benchmark::Counter(16.0 * 1024 * 32 * 4 * 128 * state.iterations(),
                                                benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Decode)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

// The decode call with every page index 0: K/V stay in the core's caches, so
// this times the kernel's arithmetic and bookkeeping without memory.
void BM_DecodeHot(benchmark::State& state) {
  tools::BatchSpec spec;
  spec.sequences = std::vector<tools::SequenceShape>(16, {1, 1024});
  const tools::SyntheticBatch batch = tools::MakeSyntheticBatch(spec);
  const std::vector<int32_t> page_zero(batch.page_indices.size(), 0);
  const TensorView pages_view = batch.PageIndices();
  const TensorView hot_pages(page_zero.data(), DType::kI32,
                             {pages_view.shape[0], pages_view.shape[1]});
  std::vector<uint8_t> out = batch.NewOutput();
  AttentionOptions options;
  options.sm_scale = 1.0 / std::sqrt(128.0);
  options.num_threads = static_cast<int>(state.range(0));
  for (auto _ : state) {
    RaggedPagedAttention(batch.Q(), batch.KvPages(), batch.KvLens(), hot_pages, batch.CuQLens(),
                         batch.NumSeqs(), options, batch.OutView(out));
  }
  state.counters["FLOP/s"] = benchmark::Counter(16.0 * 1024 * 32 * 4 * 128 * state.iterations(),
                                                benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DecodeHot)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace rpa

BENCHMARK_MAIN();
