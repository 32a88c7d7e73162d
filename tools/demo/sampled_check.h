// Checks a call's output against the f64 reference (RefRaggedPagedAttention)
// on a sample of its query rows: the first and last few rows of every
// sequence. The reference is scalar f64 over every key of a sequence, ~1000x
// slower than the kernel; on a prefill chunk's hundreds of rows it would
// cost seconds. A sequence's first r rows are a call of their own (q_len r,
// kv_len moved back by q_len - r, same pages), its last r rows too (same
// kv_len), with the same per-row results, so the reference runs on those
// sub-sequences only: the first rows check the causal mask inside the
// chunk, the last see every key, the chunk's new ones included.
#ifndef RPA_TOOLS_DEMO_SAMPLED_CHECK_H_
#define RPA_TOOLS_DEMO_SAMPLED_CHECK_H_

#include <cstdint>

#include "rpa/options.h"
#include "rpa/page_table.h"
#include "rpa/tensor.h"

namespace rpa::tools {

// A finished call: its inputs (int32 metadata contiguous) and its output.
struct FinishedCall {
  TensorView q;
  TensorView kv_pages;  // JAX's combined layout.
  PageTable table;
  AttentionOptions options;
  TensorView out;
};

struct SampledCheck {
  double ratio = 0;   // Worst |out - reference| / (tolerance + one output ulp); NaN for NaN.
  int64_t rows = 0;   // Query rows compared.
  bool Passed() const { return ratio <= 1.0; }  // False for NaN too.
};

// The larger of two ratios; NaN if either is (a NaN output never passes).
double WorseRatio(double a, double b);

// rows_per_end: how many of each sequence's first and of its last rows.
SampledCheck CheckSampledRows(const FinishedCall& call, int32_t rows_per_end);

}  // namespace rpa::tools

#endif  // RPA_TOOLS_DEMO_SAMPLED_CHECK_H_
