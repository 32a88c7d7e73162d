// Google Benchmark for the kernel's parts: the widening kernel's products on
// cache-resident tiles (compute throughput) and whole calls on K/V larger
// than the last-level cache (rotating copies), with bytes and FLOPs as rate
// counters. `rpa bench` is the end-to-end report against machine limits;
// this is for working on one piece.
#include <benchmark/benchmark.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "kernel/avx512_bf16_rows.h"
#include "kernel/avx512_wide.h"
#include "kernel/cpu_features.h"
#include "rpa/rpa.h"
#include "testing/machine.h"
#include "testing/synthetic_batch.h"
#include "testing/workloads.h"
#include "threads/thread_pool.h"

namespace rpa {
namespace {

std::vector<uint16_t> RandomBf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = BF16FromF32(normal(rng)).bits;
  return v;
}

// A kernel's QK^T or PV for decode's shape: range(2) rows (q heads per kv
// head; 4 unless given) x range(0) keys, head_dim 128, bf16 K/V rows
// range(1) elements apart (2048: 4 KiB, as in a cache page; 32 keys: L1,
// 512: L2). Per key and kv head. The pair kernel's 8-row case is what a
// hi + lo split of 4 f32 q rows (and of their f32 weights) would cost it.
void DecodeRows(benchmark::State& state, const internal::ProductKernel& kernel, bool needs_bf16,
                bool pv) {
#if defined(__x86_64__)
  const internal::CpuFeatures& cpu = internal::DetectedCpuFeatures();
  if (!cpu.avx512bw || (needs_bf16 && !cpu.avx512bf16)) {
    state.SkipWithError("CPU lacks the kernel's instructions");
    return;
  }
  const int64_t rows = state.range(2), tokens = state.range(0), dim = 128,
                row_stride = state.range(1);
  const std::vector<uint16_t> kv = RandomBf16(tokens * row_stride, 2);
  std::vector<const uint8_t*> kv_rows(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    kv_rows[t] = reinterpret_cast<const uint8_t*>(kv.data() + t * row_stride);
  }
  std::vector<float> q(rows * dim, 0.01f), s(rows * tokens, 0.01f), acc(rows * dim, 0.0f);
  internal::KvTile tile;
  tile.head_dim = dim;
  tile.row_bytes = dim * 2;
  tile.n = tokens;
  tile.k = tile.v = {kv_rows.data(), 0, tokens};
  const internal::QueryRows q_rows{q.data(), dim, rows, nullptr};
  const internal::TileLogits logits{s.data(), tokens, rows};
  const internal::SoftmaxState acc_rows{nullptr, nullptr, acc.data(), dim};
  for (auto _ : state) {
    if (pv) {
      kernel.pv(logits, tile, acc_rows, {});
    } else {
      kernel.logits(q_rows, tile, logits, {});
    }
    benchmark::DoNotOptimize(s.data());
    benchmark::DoNotOptimize(acc.data());
  }
  state.counters["ns_per_key"] = benchmark::Counter(
      static_cast<double>(tokens) * state.iterations(),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
#else
  (void)kernel;
  (void)needs_bf16;
  (void)pv;
  state.SkipWithError("x86-64 only");
#endif
}
#if defined(__x86_64__)
void BM_WideLogits(benchmark::State& state) {
  DecodeRows(state, *internal::Avx512Wide(DType::kBF16), false, false);
}
void BM_WidePv(benchmark::State& state) {
  DecodeRows(state, *internal::Avx512Wide(DType::kBF16), false, true);
}
void BM_PairLogits(benchmark::State& state) {
  DecodeRows(state, *internal::Avx512Bf16Rows(DType::kBF16), true, false);
}
void BM_PairPv(benchmark::State& state) {
  DecodeRows(state, *internal::Avx512Bf16Rows(DType::kBF16), true, true);
}
BENCHMARK(BM_WideLogits)
    ->Args({32, 2048, 4})
    ->Args({512, 2048, 4})
    ->Args({32, 128, 4})
    ->Args({32, 160, 4});
BENCHMARK(BM_WidePv)
    ->Args({32, 2048, 4})
    ->Args({512, 2048, 4})
    ->Args({32, 128, 4})
    ->Args({32, 160, 4});
BENCHMARK(BM_PairLogits)
    ->Args({32, 2048, 4})
    ->Args({32, 2048, 8})
    ->Args({512, 2048, 4})
    ->Args({32, 128, 4})
    ->Args({32, 160, 4});
BENCHMARK(BM_PairPv)
    ->Args({32, 2048, 4})
    ->Args({32, 2048, 8})
    ->Args({512, 2048, 4})
    ->Args({32, 128, 4})
    ->Args({32, 160, 4});
#endif

// One fused decode tile of decode's shape, as the task loop calls it: 4
// rows (q heads per kv head) x 32 keys, head_dim 128, bf16 K/V rows
// range(0) elements apart: 2048 (4 KiB, as in a cache page of 8 kv heads:
// every row in the same 4 L1 sets, so the rows come from L2, as in a
// decode step) or 2080 (64 B more: spread over the sets, L1-resident: the
// arithmetic alone). Per key and kv head; the bf16-pair tile (vdpbf16ps)
// against the widening one.
void FusedDecodeTile(benchmark::State& state, const internal::FusedTileKernel& kernel,
                     bool needs_bf16) {
#if defined(__x86_64__)
  const internal::CpuFeatures& cpu = internal::DetectedCpuFeatures();
  if (!cpu.avx512bw || (needs_bf16 && !cpu.avx512bf16)) {
    state.SkipWithError("CPU lacks the kernel's instructions");
    return;
  }
  const int64_t rows = 4, tokens = internal::kFusedMaxKeys, dim = 128,
                row_stride = state.range(0);
  const std::vector<uint16_t> kv = RandomBf16(tokens * row_stride, 3);
  std::vector<const uint8_t*> kv_rows(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    kv_rows[t] = reinterpret_cast<const uint8_t*>(kv.data() + t * row_stride);
  }
  // q in the kernel's format: a zero-padded f32 row through its prepare_q.
  std::vector<float> q_f32(dim, 0.05f);
  std::vector<float> q(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    kernel.prepare_q(q_f32.data(), dim, dim,
                     reinterpret_cast<uint8_t*>(q.data()) +
                         r * dim * internal::QueryElemBytes(kernel.q_format));
  }
  std::vector<float> m(rows, 0.0f), l(rows, 1.0f), acc(rows * dim, 0.0f);
  internal::KvTile tile;
  tile.head_dim = dim;
  tile.row_bytes = dim * 2;
  tile.n = tokens;
  tile.k = tile.v = {kv_rows.data(), 0, tokens};
  const internal::QueryRows q_rows{q.data(), dim, rows, nullptr};
  const internal::SoftmaxState s{m.data(), l.data(), acc.data(), dim};
  for (auto _ : state) {
    benchmark::DoNotOptimize(kernel.tile(q_rows, tile, 0.1f, s));
    benchmark::DoNotOptimize(acc.data());
  }
  state.counters["ns_per_key"] = benchmark::Counter(
      static_cast<double>(tokens) * state.iterations(),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
#else
  (void)kernel;
  (void)needs_bf16;
  state.SkipWithError("x86-64 only");
#endif
}
#if defined(__x86_64__)
void BM_FusedTileWide(benchmark::State& state) {
  FusedDecodeTile(state, *internal::Avx512WideDecode(DType::kBF16), false);
}
void BM_FusedTileBf16Pairs(benchmark::State& state) {
  FusedDecodeTile(state, *internal::Avx512Bf16Decode(DType::kBF16), true);
}
BENCHMARK(BM_FusedTileWide)->Arg(2048)->Arg(2080);
BENCHMARK(BM_FusedTileBf16Pairs)->Arg(2048)->Arg(2080);
#endif

// Decode's batch: 16 sequences x 1 query, kv 1024, 32/8 heads, head_dim
// 128, bf16; its K/V bytes and FLOPs per call.
// The whole-call benches' options: head_dim 128's softmax scale, range(0)
// threads.
AttentionOptions CallOptions(const benchmark::State& state) {
  AttentionOptions options;
  options.sm_scale = 1.0 / std::sqrt(128.0);
  options.num_threads = static_cast<int>(state.range(0));
  return options;
}

testing::SyntheticBatch DecodeBatch(int64_t q_heads_per_kv_head = 4) {
  testing::BatchSpec spec;
  spec.num_q_heads = spec.num_kv_heads * q_heads_per_kv_head;
  spec.sequences = std::vector<testing::SequenceShape>(16, {1, 1024});
  return testing::MakeSyntheticBatch(spec);
}
constexpr double kDecodeKvBytes = 16.0 * 1024 * 8 * 2 * 128 * 2;
constexpr double kDecodeFlops = 16.0 * 1024 * 32 * 4 * 128;

// DecodeBatch's pages copied onto a huge-page buffer as many times as add
// up to 512 MiB, so that successive calls, rotating through the copies,
// read K/V from memory.
struct RotatingDecodeCache {
  explicit RotatingDecodeCache(int64_t q_heads_per_kv_head = 4)
      : batch(DecodeBatch(q_heads_per_kv_head)), bytes(batch.kv_pages.size()),
                          copies(static_cast<int>((size_t{512} << 20) / bytes + 1)),
                          pages(bytes * copies) {
    for (int c = 0; c < copies; ++c) {
      std::memcpy(pages.data + bytes * c, batch.kv_pages.data(), bytes);
    }
  }
  const uint8_t* Copy(int c) const { return pages.data + bytes * c; }

  const testing::SyntheticBatch batch;
  const size_t bytes;
  const int copies;
  // Huge pages, as rpa bench and a serving engine's cache would have: with
  // 4 KiB pages every K/V page's first touch is also a TLB miss.
  testing::HugeBuffer pages;
};

// Whole decode calls on the rotating copies; range(0) threads, range(1) q
// heads per kv head (4: decode's shape; 8 as Llama-3-70B: two fused groups
// per kv head; 16: the middle class, as verify's 4 tokens x 4 q heads).
void BM_Decode(benchmark::State& state) {
  const RotatingDecodeCache cache(state.range(1));
  const testing::SyntheticBatch& batch = cache.batch;
  const TensorView kv = batch.KvPages();
  std::vector<uint8_t> out = batch.NewOutput();
  const AttentionOptions options = CallOptions(state);
  int copy = 0;
  for (auto _ : state) {
    const TensorView view(cache.Copy(copy), kv.dtype,
                          {kv.shape[0], kv.shape[1], kv.shape[2], kv.shape[3]});
    copy = (copy + 1) % cache.copies;
    RaggedPagedAttention(
        batch.Q(), view,
        PageTable{batch.KvLens(), batch.PageIndices(), batch.CuQLens(), batch.NumSeqs()}, options,
        batch.OutView(out));
  }
  state.counters["KV_bytes/s"] =
      benchmark::Counter(kDecodeKvBytes * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["FLOP/s"] = benchmark::Counter(
      kDecodeFlops * static_cast<double>(state.range(1)) / 4 * state.iterations(),
      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Decode)
    ->Args({1, 4})
    ->Args({2, 4})
    ->Args({1, 8})
    ->Args({1, 16})
    ->Args({1, 24})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Row c (2h: K of kv head h, 2h + 1: its V) of key t of decode sequence
// `seq`, in the rotating copy at base: decode's cache (16 sequences x 1024
// keys, 16-token pages in the batch's random order, 8 kv heads of 128 bf16).
struct DecodeCacheRows {
  static constexpr int64_t kSeqs = 16, kKvLen = 1024, kPageSize = 16, kKvHeads = 8;
  static constexpr int64_t kRowBytes = 128 * 2, kTile = 32;
  const testing::SyntheticBatch& batch;
  const uint8_t* operator()(const uint8_t* base, int64_t seq, int64_t t, int64_t c) const {
    const int64_t page = batch.page_indices[seq * batch.pages_per_seq + t / kPageSize];
    return base + ((page * kPageSize + t % kPageSize) * 2 * kKvHeads + c) * kRowBytes;
  }
};

// One load per cache line of the row at r (one cycle per line: the loads,
// not an add chain, bound the loop).
inline void ReadLines(const uint8_t* r, uint64_t* bits) {
  for (int64_t b = 0; b < DecodeCacheRows::kRowBytes; b += 64) {
    uint64_t x;
    std::memcpy(&x, r + b, sizeof(x));
    *bits ^= x;
  }
}

// The memory side of BM_Decode alone: the same rows read in the kernel's
// order (a sequence per task; range(2)-key tiles; per kv head the tile's K
// rows, then its V rows: row c of a token, c = 2h for K and 2h + 1 for V,
// in order of c), one load per cache line and no arithmetic, with the next
// tile's rows prefetched as WalkTiles' NextTileRows does: range(1) 0 in
// address order into L1 (Zen 5's rule), 1 each pass its own kv head's rows
// into L2 (other CPUs'), 2 none (the hardware prefetchers alone). Its time
// bounds the decode call from below on this access pattern, whatever the
// kernel computes. range(0): threads.
void BM_DecodeMemoryOnly(benchmark::State& state) {
  const RotatingDecodeCache cache;
  const DecodeCacheRows row{cache.batch};
  const int64_t prefetch = state.range(1), tile = state.range(2);
  constexpr int64_t kRowsPerToken = 2 * DecodeCacheRows::kKvHeads;
  const internal::PrefetchTo level =
      prefetch == 0 ? internal::PrefetchTo::kL1 : internal::PrefetchTo::kL2;
  internal::ThreadPool& pool = internal::GlobalThreadPool();
  std::vector<uint64_t> sums(DecodeCacheRows::kSeqs);
  int copy = 0;
  for (auto _ : state) {
    const uint8_t* base = cache.Copy(copy);
    copy = (copy + 1) % cache.copies;
    pool.ParallelFor(DecodeCacheRows::kSeqs, static_cast<int>(state.range(0)), [&](int64_t seq, int) {
      uint64_t bits = 0;
      if (prefetch != 2) {
        for (int64_t t = 0; t < tile; ++t) {
          for (int64_t c = 0; c < kRowsPerToken; ++c) {
            internal::PrefetchRow(row(base, seq, t, c), DecodeCacheRows::kRowBytes, level);
          }
        }
      }
      for (int64_t t0 = 0; t0 < DecodeCacheRows::kKvLen; t0 += tile) {
        const bool next = prefetch != 2 && t0 + tile < DecodeCacheRows::kKvLen;
        for (int64_t c = 0; c < kRowsPerToken; ++c) {
          for (int64_t t = t0; t < t0 + tile; ++t) {
            if (next && prefetch == 0) {
              // Visit (c, t) prefetches the next tile's row number c * tile
              // + t in address order: token by token, row by row.
              const int64_t j = c * tile + (t - t0);
              internal::PrefetchRow(
                  row(base, seq, t0 + tile + j / kRowsPerToken, j % kRowsPerToken),
                  DecodeCacheRows::kRowBytes, level);
            } else if (next) {
              internal::PrefetchRow(row(base, seq, t + tile, c), DecodeCacheRows::kRowBytes,
                                    level);
            }
            ReadLines(row(base, seq, t, c), &bits);
          }
        }
      }
      sums[seq] = bits;
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["KV_bytes/s"] =
      benchmark::Counter(kDecodeKvBytes * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DecodeMemoryOnly)
    ->ArgsProduct({{1}, {0, 1, 2}, {8, 16, 32}})
    ->Args({2, 0, 32})
    ->Args({2, 1, 32})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// What one core can stream of decode's cache with nothing else in the way:
// every row in address order (token by token, each 4 KiB token row whole),
// one load per line; range(1) 1: each row read also prefetches (prefetcht0)
// the row a tile (32 tokens) ahead, as the kernel's walk does; 0: the
// hardware prefetchers alone. The ceiling of any kernel that reads this
// layout so (docs/kernel_log.md, thirteenth session: software prefetches
// hold the fill buffers at 25-27 GB/s on a Zen 5 core, below the bench's
// sequential read probe).
void BM_DecodeWalk(benchmark::State& state) {
  const RotatingDecodeCache cache;
  const DecodeCacheRows row{cache.batch};
  constexpr int64_t kAhead = DecodeCacheRows::kTile, kRowsPerToken = 2 * DecodeCacheRows::kKvHeads;
  const bool prefetch = state.range(1) != 0;
  internal::ThreadPool& pool = internal::GlobalThreadPool();
  std::vector<uint64_t> sums(DecodeCacheRows::kSeqs);
  int copy = 0;
  for (auto _ : state) {
    const uint8_t* base = cache.Copy(copy);
    copy = (copy + 1) % cache.copies;
    pool.ParallelFor(DecodeCacheRows::kSeqs, static_cast<int>(state.range(0)), [&](int64_t seq, int) {
      uint64_t bits = 0;
      for (int64_t t = 0; t < DecodeCacheRows::kKvLen; ++t) {
        for (int64_t c = 0; c < kRowsPerToken; ++c) {
          if (prefetch && t + kAhead < DecodeCacheRows::kKvLen) {
            internal::PrefetchRow(row(base, seq, t + kAhead, c), DecodeCacheRows::kRowBytes,
                                  internal::PrefetchTo::kL1);
          }
          ReadLines(row(base, seq, t, c), &bits);
        }
      }
      sums[seq] = bits;
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["KV_bytes/s"] =
      benchmark::Counter(kDecodeKvBytes * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DecodeWalk)
    ->Args({1, 0})
    ->Args({1, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// The decode call with every page index 0: K/V stay in the core's caches, so
// this times the kernel's arithmetic and bookkeeping without memory.
// range(0) threads, range(1) q heads per kv head (4: decode's shape; 8 as
// Llama-3-70B, 7 as Qwen2.5-7B; 16: the middle class, as BM_Decode's).
void BM_DecodeHot(benchmark::State& state) {
  const int64_t group = state.range(1);
  const testing::SyntheticBatch batch = DecodeBatch(group);
  const std::vector<int32_t> page_zero(batch.page_indices.size(), 0);
  const TensorView pages_view = batch.PageIndices();
  const TensorView hot_pages(page_zero.data(), DType::kI32,
                             {pages_view.shape[0], pages_view.shape[1]});
  std::vector<uint8_t> out = batch.NewOutput();
  const AttentionOptions options = CallOptions(state);
  for (auto _ : state) {
    RaggedPagedAttention(batch.Q(), batch.KvPages(),
                         PageTable{batch.KvLens(), hot_pages, batch.CuQLens(), batch.NumSeqs()},
                         options, batch.OutView(out));
  }
  state.counters["FLOP/s"] = benchmark::Counter(kDecodeFlops * group / 4 * state.iterations(),
                                                benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DecodeHot)
    ->Args({1, 4})
    ->Args({2, 4})
    ->Args({1, 8})
    ->Args({1, 7})
    ->Args({1, 16})
    ->Args({1, 24})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Whole calls on a batch of `sequences` (the decode shape's heads, bf16),
// K/V from L2 and L3 after the first call: the arithmetic of a step, for
// profiles without `rpa bench`'s baselines in the way. range(0) threads.
void RunWholeCalls(benchmark::State& state, std::vector<testing::SequenceShape> sequences) {
  testing::BatchSpec spec;
  spec.sequences = std::move(sequences);
  const testing::SyntheticBatch batch = testing::MakeSyntheticBatch(spec);
  std::vector<uint8_t> out = batch.NewOutput();
  const AttentionOptions options = CallOptions(state);
  for (auto _ : state) {
    RaggedPagedAttention(batch.Q(), batch.KvPages(),
                         PageTable{batch.KvLens(), batch.PageIndices(), batch.CuQLens(),
                                   batch.NumSeqs()},
                         options, batch.OutView(out));
  }
  // q.k and p.v over the causal keys: 4 * head_dim per (row, key, q head).
  state.counters["FLOP/s"] = benchmark::Counter(
      testing::CountWork(spec).flops * state.iterations(), benchmark::Counter::kIsRate);
}

// A prefill call: 1 x 2048 tokens, causal (8 MiB of K/V).
void BM_Prefill(benchmark::State& state) { RunWholeCalls(state, testing::PrefillSequences(2048)); }
BENCHMARK(BM_Prefill)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);

// `rpa bench`'s mixed step: decodes and chunked prefills (testing/workloads.h).
void BM_Mixed(benchmark::State& state) { RunWholeCalls(state, testing::MixedSequences()); }
BENCHMARK(BM_Mixed)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace rpa

BENCHMARK_MAIN();
