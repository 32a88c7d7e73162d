#include "rpa/reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "reference/reference_impl.h"
#include "validate/validate_internal.h"

namespace rpa::internal {
namespace {

// A padding row: output 0 and, when asked for, LSE -inf (no key).
void ZeroRow(const AttentionProblem& p, int64_t token) {
  for (int64_t h = 0; h < p.num_q_heads; ++h) {
    const int64_t base = token * p.out_token_stride + h * p.out_head_stride;
    for (int64_t d = 0; d < p.head_dim; ++d) StoreFromF32(p.q_dtype, p.out, base + d, 0.0f);
    if (p.lse != nullptr) p.lse[token * p.lse_token_stride + h] = -INFINITY;
  }
}

// Sequence seq's K or V of one kv head as scaled f32: [kv_len, head_dim].
void GatherHead(const AttentionProblem& p, const PagesView& pages, float scale, int64_t seq,
                int64_t kv_len, int64_t kv_head, std::vector<float>& rows) {
  rows.resize(static_cast<size_t>(kv_len * p.head_dim));
  for (int64_t t = 0; t < kv_len; ++t) {
    const int64_t page = p.PageIndex(seq, t / p.page_size);
    const int64_t base = pages.Offset(page, t % p.page_size, kv_head);
    for (int64_t d = 0; d < p.head_dim; ++d) {
      rows[t * p.head_dim + d] = LoadAsF32(p.kv_dtype, pages.data, base + d) * scale;
    }
  }
}

// Whether row `row` of sequence seq keeps key t: always, without a custom
// mask; else its bit (docs/contract.md §1.6).
bool Kept(const AttentionProblem& p, int64_t seq, int64_t row, int64_t kv_len, int64_t t) {
  if (p.mask_bits == nullptr) return true;
  const int64_t bit = row * kv_len + t;
  return ((p.mask_bits[p.mask_begin[seq] + bit / 8] >> (bit % 8)) & 1) != 0;
}

}  // namespace

void ReferenceAttention(const AttentionProblem& p) {
  const int64_t rows_start = p.num_seqs > 0 ? p.cu_q_lens[0] : 0;
  const int64_t rows_end = p.num_seqs > 0 ? p.cu_q_lens[p.num_seqs] : 0;
  for (int64_t token = 0; token < p.num_tokens; ++token) {
    if (token < rows_start || token >= rows_end) ZeroRow(p, token);
  }

  std::vector<double> logits;
  std::vector<double> q_row(static_cast<size_t>(p.head_dim));
  std::vector<double> acc(static_cast<size_t>(p.head_dim));
  std::vector<float> keys;
  std::vector<float> values;
  for (int64_t seq = 0; seq < p.num_seqs; ++seq) {
    const int64_t q_start = p.cu_q_lens[seq];
    const int64_t q_len = p.cu_q_lens[seq + 1] - q_start;
    const int64_t kv_len = p.kv_lens[seq];
    logits.resize(static_cast<size_t>(kv_len));
    for (int64_t kv_head = 0; kv_head < p.num_kv_heads; ++kv_head) {
      GatherHead(p, p.k, p.k_scale, seq, kv_len, kv_head, keys);
      GatherHead(p, p.v, p.v_scale, seq, kv_len, kv_head, values);
      for (int64_t h = kv_head * p.QueriesPerKvHead(); h < (kv_head + 1) * p.QueriesPerKvHead();
           ++h) {
        for (int64_t j = 0; j < q_len; ++j) {
          const int64_t token = q_start + j;
          const int64_t position = kv_len - q_len + j;
          const int64_t q_base = token * p.q_token_stride + h * p.q_head_stride;
          for (int64_t d = 0; d < p.head_dim; ++d) q_row[d] = LoadAsF32(p.q_dtype, p.q, q_base + d);
          double max_logit = -INFINITY;
          int64_t kept_keys = 0;  // A key a custom mask drops takes no part at all.
          for (int64_t t = 0; t < kv_len; ++t) {
            if (!Kept(p, seq, j, kv_len, t)) continue;
            ++kept_keys;
            double dot = 0.0;
            for (int64_t d = 0; d < p.head_dim; ++d) dot += q_row[d] * keys[t * p.head_dim + d];
            double logit = dot * p.sm_scale;
            if (p.alibi_slopes != nullptr) logit += p.alibi_slopes[h] * static_cast<double>(t - position);
            if (p.soft_cap != 0.0f) logit = p.soft_cap * std::tanh(logit / p.soft_cap);
            const bool masked = p.causal && (t > position || (p.sliding_window > 0 &&
                                                              t <= position - p.sliding_window));
            if (masked) logit += p.mask_value;
            logits[t] = logit;
            max_logit = std::max(max_logit, logit);
          }
          // A sink joins the denominator only; it also bounds the shift.
          const double sink = p.sinks != nullptr ? p.sinks[h] : -INFINITY;
          const double shift = std::max(max_logit, sink);
          std::fill(acc.begin(), acc.end(), 0.0);
          double key_sum = 0.0;
          for (int64_t t = 0; t < kv_len; ++t) {
            if (!Kept(p, seq, j, kv_len, t)) continue;
            const double weight = std::exp(logits[t] - shift);
            key_sum += weight;
            for (int64_t d = 0; d < p.head_dim; ++d) acc[d] += weight * values[t * p.head_dim + d];
          }
          const double denominator = key_sum + (p.sinks != nullptr ? std::exp(sink - shift) : 0.0);
          // No key at all (kv_len 0, or all masked): the row is 0 and its LSE
          // -inf, never 0/0.
          const bool has_keys = kept_keys > 0;
          const int64_t out_base = token * p.out_token_stride + h * p.out_head_stride;
          for (int64_t d = 0; d < p.head_dim; ++d) {
            const double value = has_keys ? acc[d] / denominator : 0.0;
            StoreFromF32(p.q_dtype, p.out, out_base + d, static_cast<float>(value));
          }
          if (p.lse != nullptr) {
            p.lse[token * p.lse_token_stride + h] =
                has_keys ? static_cast<float>(shift + std::log(key_sum)) : -INFINITY;
          }
        }
      }
    }
  }
}

}  // namespace rpa::internal

namespace rpa {

void RefRaggedPagedAttention(const TensorView& q, const TensorView& kv_pages,
                             const PageTable& page_table, const AttentionOptions& options,
                             const MutableTensorView& out) {
  internal::MetadataCopy copy;
  internal::ReferenceAttention(internal::ValidateRagged(
      internal::CombinedInputs(q, kv_pages, page_table), options, out, copy));
}

void RefRaggedPagedAttention(const TensorView& q, const KVPages& kv, const PageTable& page_table,
                             const AttentionOptions& options, const MutableTensorView& out) {
  internal::MetadataCopy copy;
  internal::ReferenceAttention(
      internal::ValidateRagged(internal::SplitInputs(q, kv, page_table), options, out, copy));
}

}  // namespace rpa
