// The validated, layout-free description of one MLA run (rpa/mla.h) that the
// plan, the task loop and the kernels read, and the plan's tasks.
#ifndef RPA_SRC_MLA_MLA_PROBLEM_H_
#define RPA_SRC_MLA_MLA_PROBLEM_H_

#include <cstdint>
#include <vector>

#include "rpa/dtype.h"

namespace rpa::internal {

// Rows of query heads: element (token, head, d) at token * token_stride +
// head * head_stride + d (elements).
struct MlaRows {
  const void* data = nullptr;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};

// A cache [num_pages, page_size, dim]: slot (page, s) at page * page_stride +
// s * slot_stride (elements), its dim elements contiguous.
struct MlaPages {
  const void* data = nullptr;
  int64_t page_stride = 0;
  int64_t slot_stride = 0;
};

struct MlaProblem {
  // Extents and options, fixed by the plan.
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t dim_ckv = 0;
  int64_t dim_kpe = 0;
  int64_t page_size = 0;
  int64_t num_pages = 0;
  DType q_dtype = DType::kBF16;
  DType kv_dtype = DType::kBF16;
  bool causal = false;
  float sm_scale = 1.0f;
  int num_threads = 1;  // Resolved.

  // The plan's copy of the page table (MlaMetadata).
  int32_t num_seqs = 0;
  const int32_t* cu_q_lens = nullptr;     // [num_seqs + 1]
  const int32_t* kv_lens = nullptr;       // [num_seqs]
  const int32_t* page_indices = nullptr;  // Sequence i's from page_begin[i] on.
  const int32_t* page_begin = nullptr;    // [num_seqs + 1]

  // Bound per run.
  MlaRows q_nope, q_pe;
  void* out = nullptr;  // Like q_nope, strides out_token_stride / out_head_stride.
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;
  MlaPages ckv, kpe;
  float kv_scale = 1.0f;
  float* lse = nullptr;  // [num_tokens, num_heads], token stride lse_stride; or null.
  int64_t lse_stride = 0;

  int64_t DimQk() const { return dim_ckv + dim_kpe; }
};

// The page table a plan keeps (the caller's arrays may be freed after Plan).
struct MlaMetadata {
  std::vector<int32_t> cu_q_lens;     // [num_seqs + 1]
  std::vector<int32_t> kv_lens;       // [num_seqs]
  std::vector<int32_t> page_indices;  // [pages read]
  std::vector<int32_t> page_begin;    // [num_seqs + 1]

  void Bind(MlaProblem& p) const {
    p.cu_q_lens = cu_q_lens.data();
    p.kv_lens = kv_lens.data();
    p.page_indices = page_indices.data();
    p.page_begin = page_begin.data();
  }
};

// Rows of one task: query tokens [q_begin, q_end) of sequence seq (relative
// to its first row) times every head, over its keys [kv_begin, kv_end).
// Row r is token q_begin + r / num_heads, head r % num_heads.
struct MlaTask {
  int32_t seq = 0;
  int32_t q_begin = 0, q_end = 0;
  int32_t kv_begin = 0, kv_end = 0;
  int64_t partial_offset = -1;  // >= 0: writes a partial there (split-KV) instead of out.
};

// Partials of one query tile, split over consecutive tasks.
struct MlaMerge {
  int32_t first_task = 0;
  int32_t num_tasks = 0;
};

// Keys per KV tile: the tile's logits [128][rows] and packed latents
// [128][head_dim_ckv] stay in L2 next to the task's accumulators; 128 keys
// ran 4-8% faster than 64 on Zen 4 (PV's loop over key pairs twice as long
// per block of accumulators loaded and stored).
inline constexpr int64_t kMlaTileKeys = 128;
// Most rows (query tokens x heads) of one task: the accumulators
// [head_dim_ckv][128] f32 are 256 KiB at 512 dims.
inline constexpr int64_t kMlaMaxRows = 128;

}  // namespace rpa::internal

#endif  // RPA_SRC_MLA_MLA_PROBLEM_H_
