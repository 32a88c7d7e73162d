// rpa as a user's program sees it: one include, one library. Runs a small
// mixed batch (a decode, a chunked prefill, a prefill; GQA 2:1) over a paged
// cache, checks it against attention written out here in plain loops,
// checks a rejected input, and exits non-zero on any mismatch.
#include <rpa/rpa.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

// rpa's choice of Highway targets is its own business.
#ifdef HWY_DISABLED_TARGETS
#error "rpa leaked HWY_DISABLED_TARGETS into its consumer"
#endif

namespace {

constexpr int64_t kQHeads = 4, kKVHeads = 2, kHeadDim = 8, kPageSize = 4;
constexpr int64_t kPages = 8, kPagesPerSeq = 4, kMaxSeqs = 4, kTokens = 12;

float Pseudo(uint32_t& state) {  // Deterministic values in [-1, 1).
  state = state * 1664525u + 1013904223u;
  return static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
}

}  // namespace

int main() {
  const std::vector<int32_t> q_lens = {1, 3, 5}, kv_lens_live = {7, 9, 5};
  uint32_t state = 42;
  std::vector<float> q(kTokens * kQHeads * kHeadDim), kv(kPages * kPageSize * 2 * kKVHeads * kHeadDim);
  for (float& x : q) x = Pseudo(state);
  for (float& x : kv) x = Pseudo(state);
  std::vector<int32_t> kv_lens(kMaxSeqs, 0), cu_q_lens(kMaxSeqs + 1, 0);
  std::vector<int32_t> page_indices = {5, 1, 0, 0,   // Sequence 0: 7 tokens, pages 5, 1.
                                       2, 7, 4, 0,   // Sequence 1: 9 tokens, pages 2, 7, 4.
                                       3, 6, 0, 0,   // Sequence 2: 5 tokens, pages 3, 6.
                                       0, 0, 0, 0};
  for (size_t i = 0; i < q_lens.size(); ++i) {
    kv_lens[i] = kv_lens_live[i];
    cu_q_lens[i + 1] = cu_q_lens[i] + q_lens[i];
  }
  for (int64_t i = static_cast<int64_t>(q_lens.size()) + 1; i <= kMaxSeqs; ++i) {
    cu_q_lens[i] = cu_q_lens[i - 1];
  }
  int32_t num_seqs = static_cast<int32_t>(q_lens.size());
  std::vector<float> out(q.size(), 99.0f);

  rpa::TensorView q_view(q.data(), rpa::DType::kF32, {kTokens, kQHeads, kHeadDim});
  rpa::TensorView kv_view(kv.data(), rpa::DType::kF32, {kPages, kPageSize, 2 * kKVHeads, kHeadDim});
  rpa::TensorView kv_lens_view(kv_lens.data(), rpa::DType::kI32, {kMaxSeqs});
  rpa::TensorView pages_view(page_indices.data(), rpa::DType::kI32, {kMaxSeqs, kPagesPerSeq});
  rpa::TensorView cu_view(cu_q_lens.data(), rpa::DType::kI32, {kMaxSeqs + 1});
  rpa::TensorView num_seqs_view(&num_seqs, rpa::DType::kI32, {1});
  rpa::MutableTensorView out_view(out.data(), rpa::DType::kF32, {kTokens, kQHeads, kHeadDim});
  rpa::AttentionOptions options;
  options.sm_scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  rpa::RaggedPagedAttention(q_view, kv_view,
                            rpa::PageTable{kv_lens_view, pages_view, cu_view, num_seqs_view}, options,
                            out_view);

  // The same attention in plain loops: causal, GQA, softmax in double.
  double max_err = 0.0;
  auto kv_at = [&](int64_t seq, int64_t t, int64_t combined_head, int64_t d) {
    const int64_t page = page_indices[seq * kPagesPerSeq + t / kPageSize];
    return kv[(((page * kPageSize + t % kPageSize) * 2 * kKVHeads) + combined_head) * kHeadDim + d];
  };
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = q_lens[s], kv_len = kv_lens[s];
    for (int64_t j = 0; j < q_len; ++j) {
      const int64_t row = cu_q_lens[s] + j, pos = kv_len - q_len + j;
      for (int64_t h = 0; h < kQHeads; ++h) {
        const int64_t kvh = h / (kQHeads / kKVHeads);
        std::vector<double> w(pos + 1);
        double m = -INFINITY, sum = 0.0;
        for (int64_t t = 0; t <= pos; ++t) {
          double dot = 0.0;
          for (int64_t d = 0; d < kHeadDim; ++d) {
            dot += static_cast<double>(q[(row * kQHeads + h) * kHeadDim + d]) * kv_at(s, t, 2 * kvh, d);
          }
          w[t] = dot * options.sm_scale;
          m = std::fmax(m, w[t]);
        }
        for (double& x : w) sum += (x = std::exp(x - m));
        for (int64_t d = 0; d < kHeadDim; ++d) {
          double acc = 0.0;
          for (int64_t t = 0; t <= pos; ++t) acc += w[t] / sum * kv_at(s, t, 2 * kvh + 1, d);
          max_err = std::fmax(max_err, std::fabs(acc - out[(row * kQHeads + h) * kHeadDim + d]));
        }
      }
    }
  }
  bool padding_zero = true;
  for (int64_t i = cu_q_lens[num_seqs] * kQHeads * kHeadDim; i < static_cast<int64_t>(out.size()); ++i) {
    padding_zero = padding_zero && out[i] == 0.0f;
  }
  std::printf("rpa consumer: %d sequences, %d rows, max |rpa - loops| = %.2e, padding zero: %s\n",
              num_seqs, cu_q_lens[num_seqs], max_err, padding_zero ? "yes" : "no");

  // A rejected input: rpa::Error, and out untouched.
  options.num_kv_pages_per_block = 64;
  const std::vector<float> before = out;
  bool rejected = false;
  try {
    rpa::RaggedPagedAttention(q_view, kv_view,
                              rpa::PageTable{kv_lens_view, pages_view, cu_view, num_seqs_view}, options,
                              out_view);
  } catch (const rpa::Error& e) {
    rejected = out == before;
    std::printf("rpa consumer: rejected as expected: %.60s...\n", e.what());
  }
  const bool ok = max_err <= 1e-5 && padding_zero && rejected;
  std::printf("rpa consumer: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
