#include "demo/sampled_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "rpa/reference.h"
#include "testing/synthetic_batch.h"
#include "testing/tolerance.h"

namespace rpa::tools {
namespace {

const int32_t* Ints(const TensorView& view) { return static_cast<const int32_t*>(view.data); }

// Rows [first, first + rows) of sequence seq.
struct Part {
  int64_t seq = 0;
  int32_t first = 0;
  int32_t rows = 0;
};

std::vector<Part> SampleParts(const PageTable& table, int32_t rows_per_end) {
  const int32_t* cu = Ints(table.cu_q_lens);
  std::vector<Part> parts;
  for (int64_t i = 0; i < Ints(table.num_seqs)[0]; ++i) {
    const int32_t q_len = cu[i + 1] - cu[i];
    if (q_len <= 2 * rows_per_end) {
      if (q_len > 0) parts.push_back({i, 0, q_len});
      continue;
    }
    parts.push_back({i, 0, rows_per_end});
    parts.push_back({i, q_len - rows_per_end, rows_per_end});
  }
  return parts;
}

// The sampled rows as a call of their own, and its reference output.
struct SubCall {
  std::vector<int32_t> kv_lens, page_indices, cu_q_lens, num_seqs;
  std::vector<uint8_t> q, out;
};

SubCall ReferenceOfParts(const FinishedCall& call, const std::vector<Part>& parts) {
  const int32_t* kv_lens = Ints(call.table.kv_lens);
  const int32_t* cu = Ints(call.table.cu_q_lens);
  const int32_t* pages = Ints(call.table.page_indices);
  const int64_t pages_per_seq = call.table.page_indices.shape[1];
  const size_t row_bytes = static_cast<size_t>(call.q.shape[1] * call.q.shape[2]) *
                           SizeOf(call.q.dtype);
  SubCall sub;
  sub.cu_q_lens.push_back(0);
  for (const Part& part : parts) {
    const int32_t q_len = cu[part.seq + 1] - cu[part.seq];
    // Row j of the part sits at position kv_len - q_len + first + j.
    sub.kv_lens.push_back(kv_lens[part.seq] - q_len + part.first + part.rows);
    sub.page_indices.insert(sub.page_indices.end(), pages + part.seq * pages_per_seq,
                            pages + (part.seq + 1) * pages_per_seq);
    sub.cu_q_lens.push_back(sub.cu_q_lens.back() + part.rows);
    const uint8_t* rows = static_cast<const uint8_t*>(call.q.data) +
                          static_cast<size_t>(cu[part.seq] + part.first) * row_bytes;
    sub.q.insert(sub.q.end(), rows, rows + part.rows * row_bytes);
  }
  const int64_t n = static_cast<int64_t>(parts.size());
  const int64_t tokens = sub.cu_q_lens.back();
  sub.num_seqs = {static_cast<int32_t>(n)};
  sub.out.assign(sub.q.size(), 0);
  const PageTable table{TensorView(sub.kv_lens.data(), DType::kI32, {n}),
                        TensorView(sub.page_indices.data(), DType::kI32, {n, pages_per_seq}),
                        TensorView(sub.cu_q_lens.data(), DType::kI32, {n + 1}),
                        TensorView(sub.num_seqs.data(), DType::kI32, {1})};
  RefRaggedPagedAttention(
      TensorView(sub.q.data(), call.q.dtype, {tokens, call.q.shape[1], call.q.shape[2]}),
      call.kv_pages, table, call.options,
      MutableTensorView(sub.out.data(), call.q.dtype, {tokens, call.q.shape[1], call.q.shape[2]}));
  return sub;
}

}  // namespace

double WorseRatio(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
}

SampledCheck CheckSampledRows(const FinishedCall& call, int32_t rows_per_end) {
  const std::vector<Part> parts = SampleParts(call.table, std::max(rows_per_end, 1));
  SampledCheck check;
  if (parts.empty()) return check;
  const SubCall sub = ReferenceOfParts(call, parts);
  const int32_t* cu = Ints(call.table.cu_q_lens);
  const int64_t row_elements = call.q.shape[1] * call.q.shape[2];
  const size_t row_bytes = static_cast<size_t>(row_elements) * SizeOf(call.out.dtype);
  const double tolerance = testing::KvTolerance(call.kv_pages.dtype);
  for (size_t p = 0; p < parts.size(); ++p) {
    const uint8_t* got = static_cast<const uint8_t*>(call.out.data) +
                         static_cast<size_t>(cu[parts[p].seq] + parts[p].first) * row_bytes;
    const uint8_t* want = sub.out.data() + static_cast<size_t>(sub.cu_q_lens[p]) * row_bytes;
    const double ratio = testing::ToleranceRatio(call.out.dtype, got, want,
                                                 parts[p].rows * row_elements, tolerance);
    check.ratio = WorseRatio(check.ratio, ratio);
    check.rows += parts[p].rows;
  }
  return check;
}

}  // namespace rpa::tools
