// What an AttentionPlan holds (rpa/plan.h), and the two halves every entry
// point runs through: plan (validate, copy the metadata, build the tasks),
// then run (bind the tensors, compute). The one-call functions plan into the
// calling thread's PlanState and run it at once.
#ifndef RPA_SRC_PLAN_PLAN_STATE_H_
#define RPA_SRC_PLAN_PLAN_STATE_H_

#include "plan/plan.h"
#include "problem.h"
#include "rpa/options.h"
#include "rpa/plan.h"
#include "rpa/tensor.h"
#include "validate/metadata_copy.h"
#include "validate/validate_internal.h"

namespace rpa::internal {

struct PlanState {
  // Validated; its metadata point into `metadata`. Its tensors are bound
  // per run (BindRun), on a copy.
  AttentionProblem problem;
  MetadataCopy metadata;
  Plan tasks;
  int num_threads = 0;  // Resolved (ResolveNumThreads) when planned.
  CacheLayout layout = CacheLayout::kCombined;  // Of the runs' cache.
};

// Builds the tasks of a problem whose metadata are already copied into
// state.metadata, and keeps the problem.
void BuildTasks(const AttentionProblem& problem, PlanState& state);

// A statically valid problem: its metadata checked and copied
// (CopyMetadata), then its tasks built.
void PlanProblem(AttentionProblem problem, int32_t num_seqs, const MetadataNames& names,
                 PlanState& state);

// A ragged call's plan from its own views (the one-call functions): the
// static checks, out, then PlanProblem.
void PlanCall(const RaggedInputs& inputs, const AttentionOptions& options,
              const MutableTensorView& out, PlanState& state);

// Checks and binds one run's tensors against the plan (BindRun, on a copy
// of the planned problem), then computes.
void RunPlanned(const PlanState& state, const RunInputs& inputs, const MutableTensorView& out,
                const RunExtras& extras);

// A step's new keys and values for the fused KV write (rpa/kv_cache.h):
// [num_tokens, num_kv_heads, head_dim] each.
struct NewKvRows {
  TensorView new_k;
  TensorView new_v;
};

// Binds one run's tensors against the plan as RunPlanned does, checks the
// new rows, stores them into the run's cache at the plan's positions (each
// sequence's last q_len), then computes: everything checked before the
// first write (kv_cache.cc).
void WriteThenRun(const PlanState& state, const RunInputs& run, const NewKvRows& rows,
                  const MutableTensorView& out, const RunExtras& extras);

// The calling thread's state for the one-call functions: reused call after
// call, so a warm thread allocates nothing.
PlanState& ThreadPlanState();

}  // namespace rpa::internal

#endif  // RPA_SRC_PLAN_PLAN_STATE_H_
