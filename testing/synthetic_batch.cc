#include "testing/synthetic_batch.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "testing/tolerance.h"

namespace rpa::testing {
namespace {

void FillNormal(std::vector<uint8_t>& buffer, DType dtype, int64_t count, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < count; ++i) StoreFromF32(dtype, buffer.data(), i, normal(rng));
}

}  // namespace

SyntheticBatch MakeSyntheticBatch(const BatchSpec& spec) {
  SyntheticBatch b;
  b.spec = spec;
  std::mt19937_64 rng(spec.seed);
  const int64_t live = static_cast<int64_t>(spec.sequences.size());
  const int64_t max_num_seqs = std::max(spec.max_num_seqs, live);
  int64_t pages_needed = 0;
  int64_t longest = 0;
  int64_t total_q = 0;
  for (const SequenceShape& s : spec.sequences) {
    const int64_t pages = (s.kv_len + spec.page_size - 1) / spec.page_size;
    pages_needed += pages;
    longest = std::max(longest, pages);
    total_q += s.q_len;
  }
  const int64_t pages_per_seq = std::max(spec.pages_per_seq, longest);
  b.pages_per_seq = pages_per_seq;
  b.total_num_pages = pages_needed + spec.spare_pages;
  b.num_tokens = std::max(spec.max_num_batched_tokens, total_q);

  const int64_t kv_row = 2 * spec.num_kv_heads * spec.head_dim;
  const int64_t kv_elements = b.total_num_pages * spec.page_size * kv_row;
  b.kv_pages.assign(static_cast<size_t>(kv_elements) * SizeOf(spec.kv_dtype), 0);
  FillNormal(b.kv_pages, spec.kv_dtype, kv_elements, rng);
  const int64_t q_elements = b.num_tokens * spec.num_q_heads * spec.head_dim;
  b.q.assign(static_cast<size_t>(q_elements) * SizeOf(spec.q_dtype), 0);
  FillNormal(b.q, spec.q_dtype, q_elements, rng);

  // Pages handed out in random order, as a long-running cache fragments.
  std::vector<int32_t> free_pages(static_cast<size_t>(b.total_num_pages));
  std::iota(free_pages.begin(), free_pages.end(), 0);
  std::shuffle(free_pages.begin(), free_pages.end(), rng);
  std::vector<bool> page_used(free_pages.size(), false);

  b.kv_lens.assign(static_cast<size_t>(max_num_seqs), 0);
  b.cu_q_lens.assign(static_cast<size_t>(max_num_seqs) + 1, 0);
  // Columns no sequence reads hold garbage: the kernel must never follow them.
  std::uniform_int_distribution<int32_t> garbage(-1000000, 1000000);
  b.page_indices.resize(static_cast<size_t>(max_num_seqs * pages_per_seq));
  for (int32_t& index : b.page_indices) index = garbage(rng);
  size_t next_free = 0;
  for (int64_t i = 0; i < live; ++i) {
    const SequenceShape& s = spec.sequences[i];
    b.kv_lens[i] = s.kv_len;
    b.cu_q_lens[i + 1] = b.cu_q_lens[i] + s.q_len;
    const int64_t pages = (s.kv_len + spec.page_size - 1) / spec.page_size;
    for (int64_t column = 0; column < pages; ++column) {
      const int32_t page = free_pages[next_free++];
      page_used[page] = true;
      b.page_indices[i * pages_per_seq + column] = page;
      if (!spec.nan_beyond_kv_len) continue;
      for (int64_t slot = 0; slot < spec.page_size; ++slot) {
        if (column * spec.page_size + slot < s.kv_len) continue;
        for (int64_t e = 0; e < kv_row; ++e) {
          StoreFromF32(spec.kv_dtype, b.kv_pages.data(), (page * spec.page_size + slot) * kv_row + e,
                       NAN);
        }
      }
    }
  }
  for (int64_t i = live; i < max_num_seqs; ++i) b.cu_q_lens[i + 1] = b.cu_q_lens[i];
  if (spec.nan_beyond_kv_len) {
    for (int64_t page = 0; page < b.total_num_pages; ++page) {
      if (page_used[page]) continue;
      for (int64_t e = 0; e < spec.page_size * kv_row; ++e) {
        StoreFromF32(spec.kv_dtype, b.kv_pages.data(), page * spec.page_size * kv_row + e, NAN);
      }
    }
  }
  b.num_seqs = {static_cast<int32_t>(live)};
  return b;
}

TensorView SyntheticBatch::Q() const {
  return TensorView(q.data(), spec.q_dtype, {num_tokens, spec.num_q_heads, spec.head_dim});
}
TensorView SyntheticBatch::KvPages() const {
  return TensorView(kv_pages.data(), spec.kv_dtype,
                    {total_num_pages, spec.page_size, 2 * spec.num_kv_heads, spec.head_dim});
}
TensorView SyntheticBatch::KvLens() const {
  return TensorView(kv_lens.data(), DType::kI32, {static_cast<int64_t>(kv_lens.size())});
}
TensorView SyntheticBatch::PageIndices() const {
  const int64_t rows = static_cast<int64_t>(kv_lens.size());
  return TensorView(page_indices.data(), DType::kI32,
                    {rows, rows ? static_cast<int64_t>(page_indices.size()) / rows : 0});
}
TensorView SyntheticBatch::CuQLens() const {
  return TensorView(cu_q_lens.data(), DType::kI32, {static_cast<int64_t>(cu_q_lens.size())});
}
TensorView SyntheticBatch::NumSeqs() const {
  return TensorView(num_seqs.data(), DType::kI32, {1});
}
std::vector<uint8_t> SyntheticBatch::NewOutput() const {
  return std::vector<uint8_t>(q.size(), 0);
}
MutableTensorView SyntheticBatch::OutView(std::vector<uint8_t>& out) const {
  return MutableTensorView(out.data(), spec.q_dtype, {num_tokens, spec.num_q_heads, spec.head_dim});
}

double MaxAbsDifference(const SyntheticBatch& batch, const std::vector<uint8_t>& a,
                        const std::vector<uint8_t>& b) {
  const int64_t count = batch.num_tokens * batch.spec.num_q_heads * batch.spec.head_dim;
  double worst = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const double diff = std::fabs(static_cast<double>(LoadAsF32(batch.spec.q_dtype, a.data(), i)) -
                                  LoadAsF32(batch.spec.q_dtype, b.data(), i));
    if (std::isnan(diff)) return NAN;
    worst = std::max(worst, diff);
  }
  return worst;
}

CacheViews ViewsOf(const TensorView& kv) {
  const int64_t P = kv.shape[0], S = kv.shape[1], H = kv.shape[2] / 2, D = kv.shape[3];
  const int64_t ps = kv.strides[0], ss = kv.strides[1], hs = kv.strides[2];
  const auto* k = static_cast<const uint8_t*>(kv.data);
  const auto* v = k + D * static_cast<int64_t>(SizeOf(kv.dtype));
  CacheViews c;
  c.k_nhd = TensorView(k, kv.dtype, {P, S, H, D}, {ps, ss, 2 * hs, 1});
  c.v_nhd = TensorView(v, kv.dtype, {P, S, H, D}, {ps, ss, 2 * hs, 1});
  c.k_hnd = TensorView(k, kv.dtype, {P, H, S, D}, {ps, 2 * hs, ss, 1});
  c.v_hnd = TensorView(v, kv.dtype, {P, H, S, D}, {ps, 2 * hs, ss, 1});
  c.k_paged = TensorView(k, kv.dtype, {H, P, S, D}, {2 * hs, ps, ss, 1});
  c.v_paged = TensorView(v, kv.dtype, {H, P, S, D}, {2 * hs, ps, ss, 1});
  return c;
}

double ToleranceRatio(const SyntheticBatch& batch, const std::vector<uint8_t>& a,
                      const std::vector<uint8_t>& b, double tolerance) {
  return ToleranceRatio(batch.spec.q_dtype, a.data(), b.data(),
                        batch.num_tokens * batch.spec.num_q_heads * batch.spec.head_dim, tolerance);
}

double ToleranceRatio(DType dtype, const void* a, const void* b, int64_t count, double tolerance) {
  double worst = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const double got = LoadAsF32(dtype, a, i);
    const double want = LoadAsF32(dtype, b, i);
    const double ratio = std::fabs(got - want) /
                         (tolerance + OutputUlp(dtype) * std::fabs(want));
    if (std::isnan(ratio)) return NAN;
    worst = std::max(worst, ratio);
  }
  return worst;
}

}  // namespace rpa::testing
