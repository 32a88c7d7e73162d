// Options of ragged paged attention (docs/contract.md §1). An empty optional means
// "not given", exactly like JAX's None.
#ifndef RPA_OPTIONS_H_
#define RPA_OPTIONS_H_

#include <cfloat>
#include <cstdint>
#include <optional>
#include <string>

#include "rpa/tensor.h"

namespace rpa {

// JAX's DEFAULT_MASK_VALUE: -0.7 * float32 max, computed in double as Python
// does and used as f32.
inline constexpr double kDefaultMaskValue = -0.7 * static_cast<double>(FLT_MAX);

// Scalars are double and integers int64 so that what a Python caller passed
// is what an error message prints.
struct AttentionOptions {
  double sm_scale = 1.0;
  std::optional<int64_t> sliding_window;  // Keep keys (p - w, p].
  std::optional<double> soft_cap;         // logit = c * tanh(logit / c).
  std::optional<double> mask_value;       // Added to masked logits.
  std::optional<double> k_scale;          // Stored K is multiplied by it.
  std::optional<double> v_scale;          // Stored V is multiplied by it.
  // Tile sizes; none = chosen by the library (docs/contract.md §4).
  std::optional<int64_t> num_kv_pages_per_block;
  std::optional<int64_t> num_queries_per_block;
  // On CPU: the budget in bytes for one worker's scratch tiles.
  std::optional<int64_t> vmem_limit_bytes;
  // Worker threads (at most 256 are used); none = RPA_NUM_THREADS, else
  // the CPUs the process may use (affinity mask, cgroup quota, bound CPUs:
  // rpa/threads.h).
  std::optional<int> num_threads;

  // Beyond JAX (docs/contract.md §1 conventions).
  // false: every query row of a sequence sees all of its kv_len keys, and
  // q_len may exceed kv_len (encoders, cross attention); a sliding window
  // then is an error. None: true (JAX's causal attention), false with a
  // custom mask.
  std::optional<bool> causal;
  // A custom mask in one of FlashInfer's two forms (docs/contract.md §1.6),
  // over the live sequences in order: sequence i's q_len x kv_len block,
  // row r (its query row r), column j (key j). Nonzero / a set bit keeps the
  // key; a masked key takes no part at all. It replaces the causal mask
  // (causal must be none or false) and takes no sliding window. A plan keeps
  // its own packed copy.
  //   custom_mask         u8 [sum q_len * kv_len], one byte per key (bool)
  //   packed_custom_mask  u8 [sum ceil(q_len * kv_len / 8)], each block's bits
  //                       little-endian from its own byte
  std::optional<TensorView> custom_mask;
  std::optional<TensorView> packed_custom_mask;
  // f32 [num_q_heads]: ALiBi, logit += alibi_slopes[h] * (t - p) for key t
  // and query position p (docs/contract.md §1.6), before the soft cap. A
  // plan keeps its own copy.
  std::optional<TensorView> alibi_slopes;
  // f32 [num_q_heads]: attention sinks, one raw logit per q head that joins
  // each row's softmax denominator only (no value, no sm_scale, no soft cap).
  std::optional<TensorView> sinks;
  // f32 [max_num_batched_tokens, num_q_heads], written: each row's natural
  // log of its softmax denominator over keys (sinks excluded), -inf for rows
  // with no key and padding rows. With merge_states it combines partial
  // attentions over disjoint key sets.
  std::optional<MutableTensorView> lse;
};

// Options of JAX's decode-only paged_attention. q arrives pre-scaled, as in
// JAX: there is no sm_scale.
struct PagedAttentionOptions {
  double mask_value = kDefaultMaskValue;
  std::optional<double> attn_logits_soft_cap;
  int64_t pages_per_compute_block = 1;
  // "kv_head", "batch" or none, validated with JAX's rules (a string, so the
  // library, not each binding, owns the message for a bad value).
  std::optional<std::string> megacore_mode;
  bool inline_seq_dim = true;  // Accepted for JAX compatibility; no effect on CPU.
  std::optional<int> num_threads;
};

}  // namespace rpa

#endif  // RPA_OPTIONS_H_
