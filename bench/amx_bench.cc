// Google Benchmark for the AMX building blocks (kernel/amx.h, and
// testing/amx_experimental.h's) on
// cache-resident tiles: the tdpbf16ps peak of one thread, AmxLogits and
// AmxPv for a prefill-like tile (512 rows = 128 tokens x 4 q heads, 256
// keys, head_dim 128) in GFLOP/s, the K/V packs per key, and the decode
// option (S^T = K Q^T with K rows loaded in place from 4 KiB-strided page
// rows) against the repacked AmxLogits and the AVX-512 widening path, in ns
// per key and kv head. Each runs 5 repetitions and reports min and max:
// take the min time / max rate (other work shares the cores).
//
//   build/bench/rpa_amx_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernel/amx.h"
#include "kernel/avx512_wide.h"
#include "kernel/bf16_pairs.h"
#include "kernel/cpu_features.h"
#include "rpa/dtype.h"
#include "testing/amx_experimental.h"

#if defined(__x86_64__)
namespace rpa {
namespace {

using internal::AmxRoundUp;

std::vector<uint16_t> RandomBf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = BF16FromF32(normal(rng)).bits;
  return v;
}

// n rows of `dtype` (random bytes that are finite values), `stride` bytes apart.
struct Rows {
  std::vector<uint8_t> bytes;
  std::vector<const void*> ptrs;
};

Rows MakeRows(DType dtype, int64_t n, int64_t head_dim, int64_t stride) {
  Rows r;
  r.bytes.resize(static_cast<size_t>(n * stride + 64));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  r.ptrs.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* row = r.bytes.data() + i * stride;
    for (int64_t d = 0; d < head_dim; ++d) StoreFromF32(dtype, row, d, normal(rng));
    r.ptrs[i] = row;
  }
  return r;
}

bool NeedHardware(benchmark::State& state) {
  if (internal::AmxSupport().usable) return true;
  state.SkipWithError(internal::AmxSupport().reason.c_str());
  return false;
}

double MinOf(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double MaxOf(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

template <class B>
void Repeated(B* b) {
  b->Repetitions(5)->ComputeStatistics("min", MinOf)->ComputeStatistics("max", MaxOf)
      ->ReportAggregatesOnly(true);
}

// ---- The machine limit: 6 C tiles, tdpbf16ps back to back.
void BM_AmxPeak(benchmark::State& state) {
  if (!NeedHardware(state)) return;
  double gflops = 0;
  for (auto _ : state) gflops = testing::AmxBf16PeakGflops(0.1);
  state.counters["GFLOP/s"] = gflops;
}
BENCHMARK(BM_AmxPeak)->Iterations(1)->Apply([](benchmark::internal::Benchmark* b) {
  Repeated(b);
});

// ---- A prefill-like tile: rows x 256 keys x head_dim 128, bf16 K/V.
struct PrefillTile {
  static constexpr int64_t kKeys = 256, kDim = 128;
  explicit PrefillTile(int64_t r)
      : rows(r),
        q(RandomBf16(static_cast<size_t>(AmxRoundUp(r, 16) * kDim), 1)),
        k(MakeRows(DType::kBF16, kKeys, kDim, 4096)),
        v(MakeRows(DType::kBF16, kKeys, kDim, 4096)),
        kp(internal::AmxPackedKeysElems(kKeys, kDim)),
        vp(internal::AmxPackedValuesElems(kKeys, kDim)),
        pb(internal::AmxPvScratchElems(r, kKeys)),
        s(static_cast<size_t>(AmxRoundUp(r, 16) * kKeys)),
        acc(static_cast<size_t>(AmxRoundUp(r, 16) * kDim), 0.0f) {
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
    for (float& x : s) x = uniform(rng);
    PackK();
    PackV();
  }
  void PackK() { internal::AmxPackKeys({DType::kBF16, k.ptrs.data(), kKeys, kDim, kp.data()}); }
  void PackV() {
    internal::AmxPackValues({DType::kBF16, v.ptrs.data(), kKeys, kDim, vp.data()});
  }
  void Logits(float* out) {
    internal::AmxLogits({q.data(), kDim, rows, kp.data(), kKeys, kDim, out, kKeys});
  }
  void Pv() {
    testing::AmxPv({s.data(), kKeys, rows, vp.data(), kKeys, kDim, acc.data(), kDim, pb.data()},
                   testing::AmxBackend::kHardware);
  }
  double Flops() const { return 2.0 * rows * kKeys * kDim; }

  int64_t rows;
  std::vector<uint16_t> q;
  Rows k, v;
  std::vector<uint16_t> kp, vp, pb;
  std::vector<float> s, acc;
};

// range(0): rows; range(1): 0 logits, 1 PV, 2 both, 3 packs + both.
void BM_AmxPrefillTile(benchmark::State& state) {
  if (!NeedHardware(state)) return;
  PrefillTile t(state.range(0));
  std::vector<float> s2(t.s.size());
  const int64_t what = state.range(1);
  for (auto _ : state) {
    if (what == 3) {
      t.PackK();
      t.PackV();
    }
    if (what != 1) t.Logits(what == 0 ? t.s.data() : s2.data());
    if (what != 0) t.Pv();
    benchmark::DoNotOptimize(t.acc.data());
    benchmark::DoNotOptimize(s2.data());
  }
  const double flops = (what >= 2 ? 2 : 1) * t.Flops();
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9 * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AmxPrefillTile)
    ->ArgsProduct({{512, 128, 32}, {0, 1, 2, 3}})
    ->Apply([](benchmark::internal::Benchmark* b) { Repeated(b); });

// AmxPv's f32 -> bf16 pass over the weights alone (AVX-512; runs here):
// range(0) rows x 256 keys.
void BM_AmxWeightsToBf16(benchmark::State& state) {
  if (!internal::DetectedCpuFeatures().avx512bf16) {
    state.SkipWithError("no AVX-512 BF16");
    return;
  }
  PrefillTile t(state.range(0));
  for (auto _ : state) {
    internal::AmxWeightsToBf16(t.s.data(), t.kKeys, t.rows, t.kKeys, t.pb.data());
    benchmark::DoNotOptimize(t.pb.data());
  }
  state.counters["ns_per_key"] = benchmark::Counter(
      static_cast<double>(t.kKeys) * state.iterations(),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_AmxWeightsToBf16)->Arg(512)->Arg(32)->Apply([](benchmark::internal::Benchmark* b) {
  Repeated(b);
});

// ---- Packs: 256 keys x head_dim 128; range(0) dtype, range(1): 0 K, 1 V;
// range(2): bytes from row to row (4096: NHD pages of 8 kv heads x K, V;
// 256: HND, one head's rows back to back). ns per key.
void BM_AmxPack(benchmark::State& state) {
  if (!internal::DetectedCpuFeatures().avx512bf16) {
    state.SkipWithError("no AVX-512 BF16");
    return;
  }
  const DType dtype = static_cast<DType>(state.range(0));
  const int64_t n = 256, dim = 128;
  const Rows rows = MakeRows(dtype, n, dim, state.range(2));
  std::vector<uint16_t> out(internal::AmxPackedKeysElems(n, dim));
  for (auto _ : state) {
    if (state.range(1) == 0) {
      internal::AmxPackKeys({dtype, rows.ptrs.data(), n, dim, out.data()});
    } else {
      internal::AmxPackValues({dtype, rows.ptrs.data(), n, dim, out.data()});
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(std::string(ToString(dtype)) + (state.range(1) == 0 ? " K" : " V"));
  state.counters["ns_per_key"] = benchmark::Counter(
      static_cast<double>(n) * state.iterations(),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_AmxPack)
    ->ArgsProduct({{static_cast<int64_t>(DType::kBF16), static_cast<int64_t>(DType::kF8E4M3FN),
                    static_cast<int64_t>(DType::kF8E5M2), static_cast<int64_t>(DType::kI8)},
                   {0, 1},
                   {4096, 256}})
    ->Apply([](benchmark::internal::Benchmark* b) { Repeated(b); });

// ---- Decode: g q heads x range(1) keys, head_dim 128, bf16 K rows 4 KiB
// apart (one token's 8 kv heads x K, V: a page's row stride), per key.
// range(2): 0 AmxDecodeLogitsT (K in place), 1 AmxPackKeys + AmxLogits
// (q as A with RoundUp(g, 16) rows), 2 avx512_wide logits (AVX-512 f32 FMA).
void BM_DecodeLogits(benchmark::State& state) {
  const int64_t g = state.range(0), n = state.range(1), dim = 128, how = state.range(2);
  if (how < 2) {
    if (!NeedHardware(state)) return;
  } else if (!internal::DetectedCpuFeatures().avx512bw) {
    state.SkipWithError("no AVX-512 BW");
    return;
  }
  const Rows k = MakeRows(DType::kBF16, n, dim, 4096);
  const std::vector<uint16_t> q = RandomBf16(static_cast<size_t>(AmxRoundUp(g, 16) * dim), 5);
  std::vector<uint16_t> qt(testing::AmxPackedQtElems(g, dim));
  testing::AmxPackQt(q.data(), dim, g, dim, qt.data());
  std::vector<uint16_t> scratch(testing::AmxDecodeScratchElems(dim));
  std::vector<uint16_t> kp(internal::AmxPackedKeysElems(n, dim));
  std::vector<float> q_eo(static_cast<size_t>(g * dim), 0.01f);
  std::vector<float> s(static_cast<size_t>(AmxRoundUp(g, 16) * AmxRoundUp(n, 16)));
  std::vector<const uint8_t*> k_rows(k.ptrs.size());
  for (size_t i = 0; i < k_rows.size(); ++i) k_rows[i] = static_cast<const uint8_t*>(k.ptrs[i]);
  internal::KvTile tile;
  tile.head_dim = dim;
  tile.row_bytes = dim * 2;
  tile.n = n;
  tile.k = {k_rows.data(), 0, n};
  for (auto _ : state) {
    if (how == 0) {
      testing::AmxDecodeLogitsT(
          {DType::kBF16, k.ptrs.data(), n, dim, qt.data(), g, s.data(), g, scratch.data()},
          testing::AmxBackend::kHardware);
    } else if (how == 1) {
      internal::AmxPackKeys({DType::kBF16, k.ptrs.data(), n, dim, kp.data()});
      internal::AmxLogits({q.data(), dim, g, kp.data(), n, dim, s.data(), AmxRoundUp(n, 16)});
    } else {
      internal::Avx512Wide(DType::kBF16)
          ->logits({q_eo.data(), dim, g, nullptr}, tile, {s.data(), n, g}, {});
    }
    benchmark::DoNotOptimize(s.data());
  }
  state.SetLabel(how == 0 ? "K in place (S^T)" : how == 1 ? "repack + AmxLogits" : "avx512_wide");
  state.counters["ns_per_key"] = benchmark::Counter(
      static_cast<double>(n) * state.iterations(),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_DecodeLogits)
    ->ArgsProduct({{1, 4, 8, 16, 32}, {32, 256}, {0, 1, 2}})
    ->Apply([](benchmark::internal::Benchmark* b) { Repeated(b); });

// Decode's PV on AMX: g rows of weights x n keys, V packed per tile
// (included), head_dim 128; per key.
void BM_DecodePv(benchmark::State& state) {
  if (!NeedHardware(state)) return;
  const int64_t g = state.range(0), n = state.range(1), dim = 128;
  const Rows v = MakeRows(DType::kBF16, n, dim, 4096);
  std::vector<uint16_t> vp(internal::AmxPackedValuesElems(n, dim));
  std::vector<uint16_t> pb(internal::AmxPvScratchElems(g, n));
  std::vector<float> p(static_cast<size_t>(g * n), 0.01f);
  std::vector<float> acc(static_cast<size_t>(AmxRoundUp(g, 16) * dim), 0.0f);
  for (auto _ : state) {
    internal::AmxPackValues({DType::kBF16, v.ptrs.data(), n, dim, vp.data()});
    testing::AmxPv({p.data(), n, g, vp.data(), n, dim, acc.data(), dim, pb.data()},
                   testing::AmxBackend::kHardware);
    benchmark::DoNotOptimize(acc.data());
  }
  state.counters["ns_per_key"] = benchmark::Counter(
      static_cast<double>(n) * state.iterations(),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_DecodePv)
    ->ArgsProduct({{1, 4, 8, 16, 32}, {32, 256}})
    ->Apply([](benchmark::internal::Benchmark* b) { Repeated(b); });

}  // namespace
}  // namespace rpa
#endif  // defined(__x86_64__): elsewhere the AMX module has no functions to time.

BENCHMARK_MAIN();
