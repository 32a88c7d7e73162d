// Plan once per step, run per layer (FlashInfer's plan()/run()).
//
// An engine calls attention once per layer, 32 to 80 times per step, with
// the same page table. AttentionPlan does the per-step work once: it runs
// the dynamic validation (docs/contract.md §3.3), keeps its own copy of the
// metadata it validated, chooses the block sizes and builds the balanced
// task plan. Run then checks only the shapes, dtypes and strides of the
// layer's tensors against the plan and computes; once warm it allocates
// nothing. The one-call functions (rpa/attention.h) are a plan and a run.
#ifndef RPA_PLAN_H_
#define RPA_PLAN_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "rpa/attention.h"
#include "rpa/block_sizes.h"
#include "rpa/dtype.h"
#include "rpa/engine_page_tables.h"
#include "rpa/export.h"
#include "rpa/options.h"
#include "rpa/page_table.h"
#include "rpa/tensor.h"

namespace rpa {

namespace internal {
struct PlanState;
}  // namespace internal

// The extents, dtypes and cache layout of the tensors a plan's runs take:
// q and out [num_tokens, num_q_heads, head_dim]; the cache num_pages pages
// of page_size tokens of num_kv_heads heads of head_dim, laid out as
// kv_layout says. Every extent fits in int32.
struct AttentionShape {
  // q.shape[0] (JAX's max_num_batched_tokens; rows past the batch's tokens
  // are padding, written as zeros). -1: exactly the batch's query tokens,
  // cu_q_lens[num_seqs] or qo_indptr[batch_size] (FlashInfer's q).
  int64_t num_tokens = -1;
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t num_pages = 0;  // total_num_pages: page indices must be below it.
  int64_t page_size = 0;
  DType q_dtype = DType::kBF16;
  DType kv_dtype = DType::kBF16;
  // Separate K and V caches (KVPages) in this layout; none: JAX's combined kv_pages.
  std::optional<KVLayout> kv_layout;
  bool operator==(const AttentionShape&) const = default;
};

// The shape of these views: q [tokens, q heads, head_dim] and JAX's
// combined cache, or separate caches in their layout. Checks what the shape
// depends on as the one-call functions do (ranks, no negative extent, a
// combined cache's even head count, separate caches of one shape and dtype);
// the plan checks the rest of the shape, each run its views.
RPA_EXPORT AttentionShape ShapeOf(const TensorView& q, const TensorView& kv_pages);
RPA_EXPORT AttentionShape ShapeOf(const TensorView& q, const KVPages& kv);

// What each run takes beyond q, the cache and out: per layer, not per step.
struct RunExtras {
  std::optional<TensorView> sinks;        // f32 [num_q_heads] (AttentionOptions::sinks).
  std::optional<MutableTensorView> lse;   // f32 [num_tokens, num_q_heads], written.
  std::optional<double> k_scale;          // Overrides the plan's AttentionOptions::k_scale.
  std::optional<double> v_scale;          // Overrides the plan's AttentionOptions::v_scale.
};

// FlashInfer's window_left (the keys before the query's own position a row
// sees; -1: no window) as rpa's sliding_window (the keys a row sees, its
// own included): window_left + 1, or none for -1. Throws rpa::Error for
// window_left < -1.
RPA_EXPORT std::optional<int64_t> SlidingWindowFromWindowLeft(int64_t window_left);

// Several threads may Run one plan at once (each uses its own scratch);
// Plan must not run concurrently with Run on the same object.
class RPA_EXPORT AttentionPlan {
 public:
  AttentionPlan();
  ~AttentionPlan();
  AttentionPlan(AttentionPlan&&) noexcept;
  AttentionPlan& operator=(AttentionPlan&&) noexcept;
  AttentionPlan(const AttentionPlan&) = delete;
  AttentionPlan& operator=(const AttentionPlan&) = delete;

  // Validates the shape, the options and the page table (JAX's form, or
  // FlashInfer's CSR: rpa/engine_page_tables.h) as the one-call functions do,
  // copies what runs will read (the metadata, options.alibi_slopes and the
  // custom mask, packed), chooses block sizes and builds the tasks.
  // options.sinks and options.lse belong to runs (RunExtras) and are
  // rejected here; options.k_scale / v_scale are the runs' defaults. On
  // error (rpa::Error) the plan is as it was; re-planning reuses the
  // storage of earlier plans.
  void Plan(const AttentionShape& shape, const PageTable& page_table,
            const AttentionOptions& options);
  void Plan(const AttentionShape& shape, const CsrPageTable& page_table,
            const AttentionOptions& options);

  // Checks the views against the plan (shapes, dtypes, the innermost stride;
  // a clear rpa::Error and nothing written when they do not fit), then
  // computes into out (and extras.lse) exactly what the one-call function
  // computes on the planned page table.
  //   q     [num_tokens, num_q_heads, head_dim] of q_dtype
  //   kv_pages  [num_pages, page_size, 2 * num_kv_heads, head_dim] of kv_dtype,
  //             or kv: separate caches in their layout
  //   out   like q
  void Run(const TensorView& q, const TensorView& kv_pages, const MutableTensorView& out,
           const RunExtras& extras = {}) const;
  void Run(const TensorView& q, const KVPages& kv, const MutableTensorView& out,
           const RunExtras& extras = {}) const;
  // Run with the fused KV write (rpa/kv_cache.h): stores the step's new
  // keys and values, new_k / new_v [num_tokens, num_kv_heads, head_dim],
  // at each sequence's last q_len positions of the planned page table, then
  // attends; everything is checked before the first write. A serving step
  // plans once and calls this for every layer.
  void RunWithKVWrite(const TensorView& q, const TensorView& new_k, const TensorView& new_v,
                      const MutableTensorView& kv_pages, const MutableTensorView& out,
                      const RunExtras& extras = {}) const;

  bool planned() const;
  // The planned shape (num_tokens resolved), live sequences, threads,
  // tiles and kernels; default values before the first Plan.
  AttentionShape shape() const;
  int64_t num_seqs() const;
  int num_threads() const;
  // The tiles chosen: KV pages and query tokens per tile.
  BlockSizes block_sizes() const;
  // The kernels each class of task runs: "decode: avx512_wide_decode > avx512_wide".
  std::string DescribeKernels() const;

 private:
  std::unique_ptr<internal::PlanState> state_;  // The current plan; null before the first.
  std::unique_ptr<internal::PlanState> spare_;  // Where the next Plan is built, then swapped.
};

}  // namespace rpa

#endif  // RPA_PLAN_H_
