// Validation that produces the AttentionProblem: the static checks (shapes,
// dtypes, layouts, options) and the dynamic ones (metadata values), shared by
// every entry point so each message exists exactly once.
#ifndef RPA_SRC_VALIDATE_INTERNAL_H_
#define RPA_SRC_VALIDATE_INTERNAL_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "problem.h"
#include "rpa/attention.h"
#include "rpa/options.h"
#include "rpa/tensor.h"

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

// Dynamic checks over the metadata of a statically valid problem; sets
// problem.num_seqs to `num_seqs` once it is known to be in range.
void DynamicValidate(int32_t num_seqs, AttentionProblem& problem, const MetadataNames& names = {});

// `out` must be like q; binds it into the problem.
void BindOutput(const TensorView& q, const MutableTensorView& out, AttentionProblem& problem);

// Everything a ragged entry point runs before it computes.
AttentionProblem ValidateRagged(const RaggedInputs& inputs, const AttentionOptions& options,
                                const MutableTensorView& out);

// JAX's paged_attention, all checks; describes it as a ragged problem of one
// query per sequence, whose cu_q_lens (0, 1, ..., batch) and num_seqs live in
// `cu_q_lens_storage` (which must outlive the problem).
AttentionProblem ValidatePagedAttention(const TensorView& q, const TensorView& k_pages,
                                        const TensorView& v_pages, const TensorView& lengths,
                                        const TensorView& page_indices,
                                        const PagedAttentionOptions& options,
                                        const MutableTensorView& out,
                                        std::vector<int32_t>& cu_q_lens_storage);

}  // namespace rpa::internal

#endif  // RPA_SRC_VALIDATE_INTERNAL_H_
