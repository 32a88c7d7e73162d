// Validation that produces the AttentionProblem: the static checks (shapes,
// dtypes, layouts, options) and the dynamic ones (metadata values), shared by
// every entry point so each message exists exactly once.
#ifndef RPA_SRC_VALIDATE_VALIDATE_INTERNAL_H_
#define RPA_SRC_VALIDATE_VALIDATE_INTERNAL_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "problem.h"
#include "rpa/attention.h"
#include "rpa/engine_page_tables.h"
#include "rpa/options.h"
#include "rpa/plan.h"
#include "rpa/tensor.h"
#include "validate/metadata_copy.h"

namespace rpa::internal {

// The checks of one view that every entry point runs on its tensor
// arguments (kv_cache.cc's new rows and merge.cc's states too), so each
// message exists once.

// Views come from other people's code: an extent below 0 is a broken view
// (kShape).
void CheckNonNegativeExtents(const TensorView& t, std::string_view name);

// Elements are read as typed loads: a view at an address that is not a
// multiple of its element size (possible from a raw or NumPy buffer) would be
// undefined behaviour, so it is rejected rather than misread (kLayout;
// finding F4 in docs/robustness.md).
void CheckAligned(const TensorView& t, std::string_view name);

// CheckAligned, then: only the innermost dimension must be contiguous; an
// extent of 1 may carry any stride (NumPy and PyTorch give such strides
// arbitrary values) (kLayout).
void CheckInnermostContiguous(const TensorView& t, std::string_view name);

// The rank `rank`, spelled `dims` in the message, and no negative extent (kShape).
void CheckRank(const TensorView& t, std::string_view name, int rank, std::string_view dims);

// An extent a message names as `name=value`.
struct NamedExtent {
  std::string_view name;
  int64_t value;
};

// What a run's lse output must be: [tokens, heads] float32; `fix` says how to
// allocate it.
struct LseShape {
  NamedExtent tokens;
  NamedExtent heads;
  std::string_view fix;
};

// lse's shape, dtype and layout (kShape, kDtype, kLayout): the attention
// runs' and MLA's.
void CheckLse(const MutableTensorView& lse, const LseShape& want);

// FlashInfer's CSR extents, each view's rank checked before: qo_indptr and
// kv_indptr [batch_size + 1] (at least one entry), per_seq [batch_size]
// (kv_last_page_len, or MLA's kv_len_arr) (kShape).
void CheckCsrExtents(const TensorView& qo_indptr, const TensorView& kv_indptr,
                     const TensorView& per_seq, std::string_view per_seq_name);

enum class CacheLayout { kCombined, kNHD, kHND };

// The arguments of a ragged call; for kCombined, k_pages and v_pages are the
// same kv_pages view.
struct RaggedInputs {
  TensorView q;
  TensorView k_pages;
  TensorView v_pages;
  CacheLayout layout = CacheLayout::kCombined;
  TensorView kv_lens;
  TensorView page_indices;
  TensorView cu_q_lens;
  TensorView num_seqs;
  // Where pages_per_seq comes from, for the block-size message.
  std::string_view pages_per_seq_name = "page_indices.shape[1]";
};

RaggedInputs CombinedInputs(const TensorView& q, const TensorView& kv_pages,
                            const PageTable& page_table);
RaggedInputs SplitInputs(const TensorView& q, const KVPages& kv, const PageTable& page_table);

// Static checks; describes the problem (metadata pointers set, not read).
AttentionProblem StaticValidate(const RaggedInputs& inputs, const AttentionOptions& options);

// The names the dynamic checks print: the ragged API's, or paged_attention's.
struct MetadataNames {
  std::string_view lens = "kv_lens";
  std::string_view pages_per_seq = "pages_per_seq";
  bool require_q_len_le_kv_len = true;
};

// The dynamic checks (docs/contract.md §3.3) of a statically valid
// problem's metadata, on a copy: the live prefix of kv_lens and cu_q_lens
// and the pages the live sequences read are copied into `copy`, checked
// there, and the problem is pointed at the copy (num_seqs set).
void CopyMetadata(int32_t num_seqs, const MetadataNames& names, AttentionProblem& problem,
                  MetadataCopy& copy);

// The same checks, leaving the problem on the caller's arrays (num_seqs set).
void DynamicValidate(int32_t num_seqs, AttentionProblem& problem, const MetadataNames& names = {});

// Dynamic checks shared by every form of page table. `fix` ends each message.
void CheckNonDecreasing(std::string_view name, int64_t i, int32_t before, int32_t after,
                        std::string_view fix);
void CheckTotalQTokens(int64_t total_q_tokens, const AttentionProblem& problem,
                       std::string_view fix);
void CheckQLenAtMostKvLen(int64_t q_len, int64_t kv_len, int64_t seq, std::string_view fix);

// ---- Plans (rpa/plan.h).

// q's rows while AttentionShape::num_tokens = -1 awaits the page table: as
// many as any int32 page table can count.
inline constexpr int64_t kTokensOfPageTable = INT32_MAX;

// A plan's inputs for StaticValidate: q and the cache (in the shape's
// layout) as views of the shape's extents and dtypes without data (checked like real tensors, never
// read), and the page table. Checks that every extent fits in int32.
RaggedInputs ShapeInputs(const AttentionShape& shape, const PageTable& page_table);

// sinks and lse belong to runs (RunExtras), not to plans.
void CheckPlanOptions(const AttentionOptions& options);

// FlashInfer's CSR page table (engine_page_tables.cc). CsrShapeInputs checks
// the four views (ranks, dtypes, layout) and describes the plan's inputs as
// ShapeInputs does, with a page table of batch_size sequences of at most
// kv_indices.shape[0] pages whose views have no data; CopyCsrMetadata then
// copies and checks the values (FlashInfer's rules, then rpa's) into `copy`
// and points the problem at it, as CopyMetadata does for JAX's form.
RaggedInputs CsrShapeInputs(const AttentionShape& shape, const CsrPageTable& csr);
void CopyCsrMetadata(const CsrPageTable& csr, AttentionProblem& problem, MetadataCopy& copy);

// The tensors of one run: q and the cache (for kCombined, k_pages and
// v_pages are the same kv_pages view).
struct RunInputs {
  TensorView q;
  TensorView k_pages;
  TensorView v_pages;
  CacheLayout layout = CacheLayout::kCombined;
};
RunInputs CombinedRun(const TensorView& q, const TensorView& kv_pages);
RunInputs SplitRun(const TensorView& q, const KVPages& kv);

// The first static checks of q and the cache (StaticValidate's, which also
// ShapeOf runs): their ranks, no negative extent, separate caches of one
// shape and dtype, a combined cache's even head count.
void CheckTensorRanks(const RunInputs& inputs);
// q's head_dim is the cache's (kShape).
void CheckQHeadDim(int64_t q_head_dim, int64_t head_dim, std::string_view cache_name);
// What ShapeOf checks: CheckTensorRanks, CheckQHeadDim and the innermost
// strides, so a plan from ShapeOf rejects the views a one-call function
// would, with its messages.
void CheckShapeViews(const RunInputs& inputs);

// Checks a run's views against the planned problem (shapes, dtypes, the
// innermost stride, the extras) and binds them into it.
void BindRun(const RunInputs& inputs, const MutableTensorView& out, const RunExtras& extras,
             CacheLayout planned_layout, AttentionProblem& problem);

// The cache layout an AttentionShape names.
inline CacheLayout LayoutOf(const AttentionShape& shape) {
  if (!shape.kv_layout) return CacheLayout::kCombined;
  return *shape.kv_layout == KVLayout::kNHD ? CacheLayout::kNHD : CacheLayout::kHND;
}

// `out` must be like q; binds it into the problem.
void BindOutput(const TensorView& q, const MutableTensorView& out, AttentionProblem& problem);

// Everything a ragged entry point runs before it computes; the problem
// reads the metadata (and the options' arrays: the custom mask only there)
// from `copy`, or, without one, the caller's arrays (no custom mask).
AttentionProblem ValidateRagged(const RaggedInputs& inputs, const AttentionOptions& options,
                                const MutableTensorView& out, MetadataCopy& copy);
AttentionProblem ValidateRagged(const RaggedInputs& inputs, const AttentionOptions& options,
                                const MutableTensorView& out);

// JAX's paged_attention, its static checks: describes it as a ragged
// problem of one query per sequence (num_seqs = max_num_seqs = batch), whose
// cu_q_lens (0, 1, ..., batch) live in `cu_q_lens_storage` (which must
// outlive the problem), q, the caches and out bound.
AttentionProblem StaticValidatePagedAttention(const TensorView& q, const TensorView& k_pages,
                                              const TensorView& v_pages, const TensorView& lengths,
                                              const TensorView& page_indices,
                                              const PagedAttentionOptions& options,
                                              const MutableTensorView& out,
                                              std::vector<int32_t>& cu_q_lens_storage);

// paged_attention's names for the dynamic checks. A length-0 slot is a
// padded batch entry: its query sees no key and its row is 0, instead of
// JAX's q_len <= kv_len rule.
inline constexpr MetadataNames kPagedAttentionNames{"lengths", "pages_per_sequence", false};


}  // namespace rpa::internal

#endif  // RPA_SRC_VALIDATE_VALIDATE_INTERNAL_H_
