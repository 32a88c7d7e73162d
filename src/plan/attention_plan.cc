// AttentionPlan (rpa/plan.h) and the plan / run halves every entry point
// goes through (plan_state.h).
#include "rpa/plan.h"

#include <algorithm>
#include <iterator>
#include <memory>
#include <utility>

#include "format.h"
#include "plan/plan_state.h"
#include "run/compute.h"
#include "threads/thread_pool.h"

namespace rpa {
namespace internal {
namespace {

// A plan of no sequences has no tasks (and no tiles to choose).
void ClearTasks(Plan& plan) {
  plan.tasks.clear();
  plan.order.clear();
  plan.costs.clear();
  plan.merges.clear();
  plan.partial_floats = 0;
  plan.q_tile = plan.pages_per_block = plan.kv_block = 0;
  std::fill(std::begin(plan.class_used), std::end(plan.class_used), false);
}

// AttentionShape::num_tokens = -1: q holds exactly the batch's rows.
void ResolveTokens(const AttentionShape& shape, AttentionProblem& p) {
  if (shape.num_tokens == -1) p.num_tokens = p.cu_q_lens[p.num_seqs];
}

// A plan from a shape: the static checks of `inputs`, the page table
// checked and copied by `copy` into the spare state, the tasks; then the
// spare state becomes the plan (a rejected plan leaves the current one).
template <typename CopyFn>
void Replan(const AttentionShape& shape, const RaggedInputs& inputs,
            const AttentionOptions& options, const CopyFn& copy,
            std::unique_ptr<PlanState>& state, std::unique_ptr<PlanState>& spare) {
  AttentionProblem problem = StaticValidate(inputs, options);
  if (!spare) spare = std::make_unique<PlanState>();
  copy(problem, spare->metadata);
  ResolveTokens(shape, problem);
  spare->layout = LayoutOf(shape);
  BuildTasks(problem, *spare);
  std::swap(state, spare);
}

}  // namespace

void BuildTasks(const AttentionProblem& problem, PlanState& state) {
  state.problem = problem;
  state.num_threads = ResolveNumThreads(problem.num_threads);
  if (problem.num_seqs > 0) {
    BuildPlan(problem, state.num_threads, state.tasks);
  } else {
    ClearTasks(state.tasks);
  }
}

void PlanProblem(AttentionProblem problem, int32_t num_seqs, const MetadataNames& names,
                 PlanState& state) {
  CopyMetadata(num_seqs, names, problem, state.metadata);
  BuildTasks(problem, state);
}

void PlanCall(const RaggedInputs& inputs, const AttentionOptions& options,
              const MutableTensorView& out, PlanState& state) {
  AttentionProblem problem = StaticValidate(inputs, options);
  BindOutput(inputs.q, out, problem);
  state.layout = inputs.layout;
  PlanProblem(problem, *static_cast<const int32_t*>(inputs.num_seqs.data), {}, state);
}

void RunPlanned(const PlanState& state, const RunInputs& inputs, const MutableTensorView& out,
                const RunExtras& extras) {
  AttentionProblem problem = state.problem;
  BindRun(inputs, out, extras, state.layout, problem);
  RunPlan(problem, state.tasks);
}

PlanState& ThreadPlanState() {
  thread_local PlanState state;
  return state;
}

}  // namespace internal

std::optional<int64_t> SlidingWindowFromWindowLeft(int64_t window_left) {
  RPA_CHECK(window_left >= -1, ErrorKind::kOption,
            internal::StrCat(internal::NameEq("window_left", window_left),
                             " must be -1 (no window) or >= 0."),
            "FlashInfer's window_left counts the keys before the query's own position a row "
            "sees: sliding_window = window_left + 1.");
  if (window_left == -1) return std::nullopt;
  return window_left + 1;
}

AttentionShape ShapeOf(const TensorView& q, const TensorView& kv_pages) {
  internal::CheckShapeViews(internal::CombinedRun(q, kv_pages));
  return AttentionShape{q.shape[0],        q.shape[1],        kv_pages.shape[2] / 2,
                        kv_pages.shape[3], kv_pages.shape[0], kv_pages.shape[1],
                        q.dtype,           kv_pages.dtype,    std::nullopt};
}

AttentionShape ShapeOf(const TensorView& q, const KVPages& kv) {
  internal::CheckShapeViews(internal::SplitRun(q, kv));
  const TensorView& k = kv.k_pages;
  const bool nhd = kv.layout == KVLayout::kNHD;
  return AttentionShape{q.shape[0], q.shape[1], nhd ? k.shape[2] : k.shape[1],
                        k.shape[3], k.shape[0], nhd ? k.shape[1] : k.shape[2],
                        q.dtype,    k.dtype,    kv.layout};
}

AttentionPlan::AttentionPlan() = default;
AttentionPlan::~AttentionPlan() = default;
AttentionPlan::AttentionPlan(AttentionPlan&&) noexcept = default;
AttentionPlan& AttentionPlan::operator=(AttentionPlan&&) noexcept = default;

void AttentionPlan::Plan(const AttentionShape& shape, const PageTable& page_table,
                         const AttentionOptions& options) {
  internal::CheckPlanOptions(options);
  const int32_t* num_seqs = static_cast<const int32_t*>(page_table.num_seqs.data);
  internal::Replan(shape, internal::ShapeInputs(shape, page_table), options,
                   [&](internal::AttentionProblem& problem, internal::MetadataCopy& copy) {
                     internal::CopyMetadata(*num_seqs, {}, problem, copy);
                   },
                   state_, spare_);
}

void AttentionPlan::Plan(const AttentionShape& shape, const CsrPageTable& page_table,
                         const AttentionOptions& options) {
  internal::CheckPlanOptions(options);
  internal::Replan(shape, internal::CsrShapeInputs(shape, page_table), options,
                   [&](internal::AttentionProblem& problem, internal::MetadataCopy& copy) {
                     internal::CopyCsrMetadata(page_table, problem, copy);
                   },
                   state_, spare_);
}

namespace {

const internal::PlanState& Planned(const std::unique_ptr<internal::PlanState>& state) {
  RPA_CHECK(state != nullptr, ErrorKind::kMetadata, "This AttentionPlan has no plan yet.",
            "Call Plan(shape, page_table, options) with the step's page table before Run.");
  return *state;
}

}  // namespace

void AttentionPlan::Run(const TensorView& q, const TensorView& kv_pages,
                        const MutableTensorView& out, const RunExtras& extras) const {
  internal::RunPlanned(Planned(state_), internal::CombinedRun(q, kv_pages), out, extras);
}

void AttentionPlan::Run(const TensorView& q, const KVPages& kv, const MutableTensorView& out,
                        const RunExtras& extras) const {
  internal::RunPlanned(Planned(state_), internal::SplitRun(q, kv), out, extras);
}

void AttentionPlan::RunWithKVWrite(const TensorView& q, const TensorView& new_k,
                                   const TensorView& new_v, const MutableTensorView& kv_pages,
                                   const MutableTensorView& out, const RunExtras& extras) const {
  internal::WriteThenRun(Planned(state_), internal::CombinedRun(q, kv_pages), {new_k, new_v}, out,
                         extras);
}

bool AttentionPlan::planned() const { return state_ != nullptr; }

AttentionShape AttentionPlan::shape() const {
  if (!state_) return {};
  const internal::AttentionProblem& p = state_->problem;
  const internal::CacheLayout layout = state_->layout;
  return AttentionShape{p.num_tokens, p.num_q_heads, p.num_kv_heads, p.head_dim,
                        p.num_pages,  p.page_size,   p.q_dtype,      p.kv_dtype,
                        layout == internal::CacheLayout::kCombined ? std::nullopt
                        : layout == internal::CacheLayout::kNHD
                            ? std::optional<KVLayout>(KVLayout::kNHD)
                            : std::optional<KVLayout>(KVLayout::kHND)};
}

int64_t AttentionPlan::num_seqs() const { return state_ ? state_->problem.num_seqs : 0; }

int AttentionPlan::num_threads() const {
  return state_ ? state_->num_threads : 0;
}

BlockSizes AttentionPlan::block_sizes() const {
  if (!state_) return {};
  return BlockSizes{state_->tasks.pages_per_block, state_->tasks.q_tile};
}

std::string AttentionPlan::DescribeKernels() const {
  return state_ ? state_->tasks.DescribeKernels() : "none";
}

}  // namespace rpa
