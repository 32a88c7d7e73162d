#include "bench_mla.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "rpa/mla.h"
#include "testing/mla_batch.h"
#include "testing/onednn_mla_peer.h"
#include "testing/onednn_peer.h"

namespace rpa::tools {
namespace {

using Clock = std::chrono::steady_clock;

double MedianSeconds(const std::function<void()>& fn, bool quick, int* reps) {
  std::vector<double> times;
  const auto start = Clock::now();
  const double budget = quick ? 0.5 : 2.0;
  while (times.size() < static_cast<size_t>(quick ? 3 : 7) ||
         (std::chrono::duration<double>(Clock::now() - start).count() < budget &&
          times.size() < 50)) {
    const auto t0 = Clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  *reps = static_cast<int>(times.size());
  return times[times.size() / 2];
}

// The largest |a - b| over two bf16 outputs, and whether every element is
// within 2e-2 plus one bf16 ulp of b (both are rounded to bf16).
double MaxDiffChecked(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, bool* ok) {
  double most = 0;
  *ok = true;
  for (size_t i = 0; i < a.size() / 2; ++i) {
    const double x = LoadAsF32(DType::kBF16, a.data(), static_cast<int64_t>(i));
    const double y = LoadAsF32(DType::kBF16, b.data(), static_cast<int64_t>(i));
    const double d = std::fabs(x - y);
    most = std::max(most, d);
    *ok = *ok && d <= 2e-2 + 0x1p-7 * std::fabs(y);
  }
  return most;
}

}  // namespace

std::vector<MlaDecodeRow> RunMlaDecode(int all_threads, bool quick,
                                       const std::function<void(const std::string&)>& progress) {
  std::vector<MlaDecodeRow> rows;
  for (const int64_t heads : {16, 128}) {
    const std::string name = "mla-decode-" + std::to_string(heads) + "h";
    progress(name + ": building the batch");
    testing::MlaBatchSpec spec;
    spec.num_heads = heads;
    spec.page_size = 64;
    spec.sequences.assign(32, testing::MlaSequence{1, 4096});
    spec.seed = 24;
    const testing::MlaBatch batch = testing::MakeMlaBatch(spec);
    // DeepSeek-V3: (128 + 64) ** -0.5; the cache (151 MB) is larger than the LLC.
    MlaOptions options;
    options.causal = true;
    options.sm_scale = 1.0 / std::sqrt(192.0);
    const int counts[2] = {1, all_threads};
    for (int ti = 0; ti < (all_threads > 1 ? 2 : 1); ++ti) {
      options.num_threads = counts[ti];
      progress(name + " threads=" + std::to_string(counts[ti]));
      MlaPlan plan;
      plan.Plan(batch.Shape(), batch.PageTable(), options);
      std::vector<uint8_t> out = batch.NewOutput();
      auto call = [&] {
        plan.Run(batch.QNope(), batch.QPe(), batch.CkvCache(), batch.KpeCache(),
                 batch.OutView(out));
      };
      call();  // Warm up: threads, scratch.
      MlaDecodeRow row;
      row.name = name;
      row.threads = counts[ti];
      row.ms = MedianSeconds(call, quick, &row.reps) * 1e3;
      row.flops = 32.0 * 4096 * heads * (2.0 * (512 + 64) + 2.0 * 512);
      row.latent_bytes = batch.LatentBytes();
      row.tokens_per_s = 32 / (row.ms * 1e-3);
      row.path = plan.DescribeKernels();
      if (testing::GetOnednnPeerInfo().available) {
        progress(name + " threads=" + std::to_string(counts[ti]) + ": oneDNN peer");
        testing::OnednnMlaPeer peer(batch, counts[ti], options.sm_scale, options.causal);
        std::vector<uint8_t> peer_out = batch.NewOutput();
        peer.Run(peer_out.data());
        bool ok = false;
        row.onednn_max_abs_diff = MaxDiffChecked(peer_out, out, &ok);
        if (!ok) {
          throw std::runtime_error("the oneDNN MLA peer disagrees with rpa on " + name +
                                   ": max abs difference " +
                                   std::to_string(row.onednn_max_abs_diff));
        }
        int peer_reps = 0;
        row.onednn_ms = MedianSeconds([&] { peer.Run(peer_out.data()); }, quick, &peer_reps) * 1e3;
        row.onednn_impl = peer.MatmulImpl();
      }
      rows.push_back(row);
    }
  }
  return rows;
}

}  // namespace rpa::tools
