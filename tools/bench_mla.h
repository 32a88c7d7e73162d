// `rpa bench`'s mla-decode workload (issue 24): DeepSeek-V3's MLA decode,
// 16 heads (tensor parallel 8) and 128 heads, 32 requests x 4096 latent
// tokens, bf16, page_size 64, causal, through rpa::MlaPlan, with the oneDNN
// MLA peer (testing/onednn_mla_peer.h) checked against it and timed on the
// same thread count. tools/bench.cc reports the rows with the others.
#ifndef RPA_TOOLS_BENCH_MLA_H_
#define RPA_TOOLS_BENCH_MLA_H_

#include <functional>
#include <string>
#include <vector>

namespace rpa::tools {

struct MlaDecodeRow {
  std::string name;  // "mla-decode-16h", "mla-decode-128h".
  int threads = 1;
  int reps = 0;
  double ms = 0;            // Median of the timed runs.
  double flops = 0;         // 2 (ckv + kpe) + 2 ckv per (q head, key).
  double latent_bytes = 0;  // The keys' ckv and kpe rows, once each.
  double tokens_per_s = 0;  // Decode tokens (requests) per second.
  std::string path;         // MlaPlan::DescribeKernels().
  double onednn_ms = -1;    // -1: built without oneDNN.
  double onednn_max_abs_diff = 0;
  std::string onednn_impl;
};

// The rows for 1 and all_threads threads (once when all_threads == 1).
// Throws std::runtime_error if the oneDNN peer disagrees with rpa.
std::vector<MlaDecodeRow> RunMlaDecode(int all_threads, bool quick,
                                       const std::function<void(const std::string&)>& progress);

}  // namespace rpa::tools

#endif  // RPA_TOOLS_BENCH_MLA_H_
