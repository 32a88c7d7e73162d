// The validated, layout-free description of one attention call that
// validation produces and every implementation (reference, kernels)
// consumes. All three KV layouts and JAX's paged_attention become this
// through strides; nothing downstream knows which layout it came from.
#ifndef RPA_SRC_PROBLEM_H_
#define RPA_SRC_PROBLEM_H_

#include <algorithm>
#include <cstdint>

#include "rpa/dtype.h"

namespace rpa::internal {

// K or V pages seen as [num_pages, page_size, num_kv_heads, head_dim];
// strides in elements, head_dim contiguous.
struct PagesView {
  const void* data = nullptr;
  int64_t page_stride = 0;
  int64_t slot_stride = 0;
  int64_t head_stride = 0;

  // Offset in elements of element 0 of (page, slot, head).
  int64_t Offset(int64_t page, int64_t slot, int64_t head) const {
    return page * page_stride + slot * slot_stride + head * head_stride;
  }
};

// Readable bytes past the last block of a packed custom mask: the softmax
// reads whole bytes around a vector's bits (softmax-inl.h, MaskBytes).
inline constexpr int64_t kMaskPadBytes = 64;

struct AttentionProblem {
  // Extents.
  int64_t num_tokens = 0;  // max_num_batched_tokens: q's rows.
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t num_pages = 0;  // total_num_pages.
  int64_t page_size = 0;
  int64_t max_num_seqs = 0;
  int64_t pages_per_seq = 0;

  // q [num_tokens, num_q_heads, head_dim] and out (same shape and dtype).
  DType q_dtype = DType::kF32;
  const void* q = nullptr;
  int64_t q_token_stride = 0;
  int64_t q_head_stride = 0;
  void* out = nullptr;
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;

  DType kv_dtype = DType::kF32;
  PagesView k;
  PagesView v;

  // Metadata; validated: 0 <= num_seqs <= max_num_seqs, kv_lens >= 0,
  // cu_q_lens non-decreasing from >= 0 up to <= num_tokens, q_len <= kv_len
  // when causal,
  // and every page index of the first ceil(kv_len / page_size) columns of
  // each live sequence in [0, num_pages).
  // Sequence i's pages start at page_indices + page_begin[i] when page_begin
  // is set (a plan's compact copy: every form of page table becomes it,
  // src/validate/metadata_copy.h), else at row i of JAX's padded matrix.
  const int32_t* kv_lens = nullptr;       // [max_num_seqs]
  const int32_t* page_indices = nullptr;  // [max_num_seqs, pages_per_seq] or compact
  int64_t page_indices_row_stride = 0;
  const int64_t* page_begin = nullptr;    // [num_seqs] or null
  const int32_t* cu_q_lens = nullptr;     // [max_num_seqs + 1]
  int32_t num_seqs = 0;

  // Options, resolved to plain values.
  float sm_scale = 1.0f;
  float mask_value = 0.0f;
  float soft_cap = 0.0f;        // 0: no soft cap.
  int64_t sliding_window = 0;   // 0: no window (always 0 when not causal).
  bool causal = true;           // false: every row sees all its kv_len keys.
  // [num_q_heads] or null: logit += alibi_slopes[h] * (key - query position),
  // before the soft cap.
  const float* alibi_slopes = nullptr;
  // The custom mask as given (a view of the caller's array, read only when
  // copied: MetadataCopy::CopyOptionArrays) ...
  struct MaskInput {
    bool present = false;           // A mask was passed (its data may be null: 0 bytes).
    const uint8_t* data = nullptr;
    int64_t size = 0;               // Elements (bytes).
    bool packed = false;            // packed_custom_mask, else custom_mask.
  };
  MaskInput mask_input;
  // ... and as the runs read it: sequence i's q_len x kv_len block of bits,
  // row-major, from byte mask_begin[i] of mask_bits; bit b of a block is
  // (block[b / 8] >> (b % 8)) & 1 and a set bit keeps the key. The buffer
  // has kMaskPadBytes readable bytes past its last block. Null: no mask.
  const uint8_t* mask_bits = nullptr;
  const int64_t* mask_begin = nullptr;  // [num_seqs]
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  int64_t num_kv_pages_per_block = 0;  // 0: chosen by the library.
  int64_t num_queries_per_block = 0;   // 0: chosen by the library.
  int64_t vmem_limit_bytes = 0;        // 0: no limit given.
  int num_threads = 0;                 // 0: RPA_NUM_THREADS, else every core.

  // Extras; null when not asked for.
  const float* sinks = nullptr;  // [num_q_heads]: joins each row's denominator.
  float* lse = nullptr;          // [num_tokens, num_q_heads] (head stride 1).
  int64_t lse_token_stride = 0;

  int64_t QueriesPerKvHead() const { return num_q_heads / num_kv_heads; }
  int32_t PageIndex(int64_t seq, int64_t column) const {
    const int64_t row = page_begin != nullptr ? page_begin[seq] : seq * page_indices_row_stride;
    return page_indices[row + column];
  }
  // The keys [begin, end) that a row at query position pos sees by the
  // causal and window rules (docs/contract.md §1.1); the other keys below
  // kv_len are masked (mask_value). begin may exceed end (no key).
  struct KeyRange {
    int64_t begin = 0;
    int64_t end = 0;
  };
  KeyRange VisibleKeys(int64_t pos, int64_t kv_len) const {
    if (!causal) return {0, kv_len};
    return {sliding_window > 0 ? std::max<int64_t>(pos - sliding_window + 1, 0) : 0,
            std::min(pos + 1, kv_len)};
  }
  // Whether fully masked key blocks may be skipped (docs/contract.md §1): their weight is
  // then exactly 0 in f32.
  bool MaskedKeysVanish() const { return mask_value <= -1e4f; }
};

}  // namespace rpa::internal

#endif  // RPA_SRC_PROBLEM_H_
