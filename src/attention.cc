// The one-call entry points: a plan in the calling thread's state, run at
// once (plan_state.h), the same path as AttentionPlan's.
#include "rpa/attention.h"

#include <vector>

#include "plan/plan_state.h"
#include "run/compute.h"
#include "validate/validate_internal.h"

namespace rpa {
namespace {

void PlanThenRun(const internal::RaggedInputs& inputs, const internal::RunInputs& run,
                 const AttentionOptions& options, const MutableTensorView& out) {
  internal::PlanState& state = internal::ThreadPlanState();
  internal::PlanCall(inputs, options, out, state);
  internal::RunPlanned(state, run, out, RunExtras{options.sinks, options.lse, {}, {}});
}

}  // namespace

void RaggedPagedAttention(const TensorView& q, const TensorView& kv_pages,
                          const PageTable& page_table, const AttentionOptions& options,
                          const MutableTensorView& out) {
  PlanThenRun(internal::CombinedInputs(q, kv_pages, page_table),
              internal::CombinedRun(q, kv_pages), options, out);
}

void RaggedPagedAttention(const TensorView& q, const KVPages& kv, const PageTable& page_table,
                          const AttentionOptions& options, const MutableTensorView& out) {
  PlanThenRun(internal::SplitInputs(q, kv, page_table), internal::SplitRun(q, kv), options, out);
}

void PagedAttention(const TensorView& q, const TensorView& k_pages, const TensorView& v_pages,
                    const TensorView& lengths, const TensorView& page_indices,
                    const PagedAttentionOptions& options, const MutableTensorView& out) {
  std::vector<int32_t> cu_q_lens;
  internal::PlanState& state = internal::ThreadPlanState();
  const internal::AttentionProblem problem = internal::StaticValidatePagedAttention(
      q, k_pages, v_pages, lengths, page_indices, options, out, cu_q_lens);
  internal::PlanProblem(problem, static_cast<int32_t>(problem.max_num_seqs),
                        internal::kPagedAttentionNames, state);
  // The static validation bound and checked the tensors (JAX's cache
  // [kv_heads, pages, page_size, head_dim] through its strides): run.
  internal::RunPlan(state.problem, state.tasks);
}

}  // namespace rpa
