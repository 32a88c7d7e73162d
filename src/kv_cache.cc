#include "rpa/kv_cache.h"

#include "format.h"
#include "plan/plan_state.h"
#include "run/compute.h"
#include "validate/validate_internal.h"

namespace rpa {
namespace {

using internal::AttentionProblem;
using ::rpa::ErrorKind;
using internal::PagesView;
using internal::PyRepr;
using internal::StrCat;

void CheckNewRows(const TensorView& rows, std::string_view name, const AttentionProblem& p) {
  RPA_CHECK(rows.rank == 3 && rows.shape[0] == p.num_tokens && rows.shape[1] == p.num_kv_heads &&
                rows.shape[2] == p.head_dim,
            ErrorKind::kShape,
            StrCat(name, ".shape=", rows.ShapeString(), " must be (", p.num_tokens, ", ",
                   p.num_kv_heads, ", ", p.head_dim,
                   ") = (max_num_batched_tokens, num_kv_heads, head_dim)."),
            StrCat("Row r of ", name, " belongs to q row r: give it q's rows, the cache's kv "
                   "heads and head_dim."));
  const DType d = rows.dtype;
  RPA_CHECK(d == DType::kF32 || d == DType::kBF16 || d == DType::kF16 || d == DType::kF8E4M3FN ||
                d == DType::kF8E5M2 || d == DType::kI8,
            ErrorKind::kDtype,
            StrCat(name, ".dtype=", PyRepr(d), " is not supported; ", name,
                   " must be one of float32, bfloat16, float16, float8_e4m3fn, float8_e5m2, int8."),
            StrCat("Cast ", name, " to one of these dtypes."));
  internal::CheckInnermostContiguous(rows, name);  // Aligned too: rows are read as typed loads.
}

// Stores row `row` of `rows` (one kv head) at `offset` of `pages`, as x / scale.
void StoreRow(const TensorView& rows, int64_t row, int64_t kv_head, const AttentionProblem& p,
              const PagesView& pages, int64_t offset, float scale) {
  // The caller handed the cache over as mutable; validation saw it as const.
  void* cache = const_cast<void*>(pages.data);
  const int64_t base = row * rows.strides[0] + kv_head * rows.strides[1];
  for (int64_t d = 0; d < p.head_dim; ++d) {
    StoreFromF32(p.kv_dtype, cache, offset + d, LoadAsF32(rows.dtype, rows.data, base + d) / scale);
  }
}

void WriteNewTokens(const TensorView& new_k, const TensorView& new_v, const AttentionProblem& p) {
  for (int64_t seq = 0; seq < p.num_seqs; ++seq) {
    const int64_t q_start = p.cu_q_lens[seq];
    const int64_t q_len = p.cu_q_lens[seq + 1] - q_start;
    const int64_t kv_len = p.kv_lens[seq];
    for (int64_t j = 0; j < q_len; ++j) {
      const int64_t position = kv_len - q_len + j;
      const int64_t page = p.PageIndex(seq, position / p.page_size);
      const int64_t slot = position % p.page_size;
      for (int64_t h = 0; h < p.num_kv_heads; ++h) {
        StoreRow(new_k, q_start + j, h, p, p.k, p.k.Offset(page, slot, h), p.k_scale);
        StoreRow(new_v, q_start + j, h, p, p.v, p.v.Offset(page, slot, h), p.v_scale);
      }
    }
  }
}

// The new tokens are each sequence's last q_len positions: without the
// causal rule (causal=false lets q_len exceed kv_len) they must still fit.
void CheckNewTokensFit(const AttentionProblem& p) {
  for (int64_t seq = 0; seq < p.num_seqs; ++seq) {
    internal::CheckQLenAtMostKvLen(p.cu_q_lens[seq + 1] - p.cu_q_lens[seq], p.kv_lens[seq], seq,
                                   "The fused write stores a sequence's new tokens at its last "
                                   "q_len positions: kv_lens[i] must count them.");
  }
}

}  // namespace

namespace internal {

void WriteThenRun(const PlanState& state, const RunInputs& run, const NewKvRows& rows,
                  const MutableTensorView& out, const RunExtras& extras) {
  AttentionProblem problem = state.problem;
  BindRun(run, out, extras, state.layout, problem);
  CheckNewRows(rows.new_k, "new_k", problem);
  CheckNewRows(rows.new_v, "new_v", problem);
  CheckNewTokensFit(problem);
  WriteNewTokens(rows.new_k, rows.new_v, problem);
  RunPlan(problem, state.tasks);
}

}  // namespace internal

namespace {

// Plans into the calling thread's state (validating everything, the
// metadata on the plan's copy), then writes and runs.
void WriteThenAttend(const internal::RaggedInputs& inputs, const internal::RunInputs& run,
                     const TensorView& new_k, const TensorView& new_v,
                     const AttentionOptions& options, const MutableTensorView& out) {
  internal::PlanState& state = internal::ThreadPlanState();
  internal::PlanCall(inputs, options, out, state);
  internal::WriteThenRun(state, run, {new_k, new_v}, out,
                         RunExtras{options.sinks, options.lse, {}, {}});
}

}  // namespace

void RaggedPagedAttentionWithKVWrite(const TensorView& q, const TensorView& new_k,
                                     const TensorView& new_v, const MutableTensorView& kv_pages,
                                     const PageTable& page_table, const AttentionOptions& options,
                                     const MutableTensorView& out) {
  WriteThenAttend(internal::CombinedInputs(q, kv_pages, page_table),
                  internal::CombinedRun(q, kv_pages), new_k, new_v, options, out);
}

void RaggedPagedAttentionWithKVWrite(const TensorView& q, const TensorView& new_k,
                                     const TensorView& new_v, const MutableKVPages& kv,
                                     const PageTable& page_table, const AttentionOptions& options,
                                     const MutableTensorView& out) {
  const KVPages pages{kv.k_pages, kv.v_pages, kv.layout};
  WriteThenAttend(internal::SplitInputs(q, pages, page_table), internal::SplitRun(q, pages), new_k,
                  new_v, options, out);
}

}  // namespace rpa
