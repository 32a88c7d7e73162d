// MLA: DeepSeek's multi-head latent attention over a paged latent cache, in
// the absorbed form (FlashInfer's BatchMLAPagedAttentionWrapper), planned
// once per step and run per layer like AttentionPlan (rpa/plan.h).
//
// Every cached token holds one latent vector ckv [head_dim_ckv] (kv_lora_rank,
// 512 in DeepSeek-V2/V3) and one shared rotary key kpe [head_dim_kpe] (64).
// With the up-projections absorbed into q and out, each of the num_heads q
// heads attends to that one latent "head":
//   logit[t] = (q_nope . ckv[t] + q_pe . kpe[t]) * sm_scale * kv_scale
//   out      = sum_t softmax(logit)[t] * ckv[t] * kv_scale
// over the keys t the row sees: all kv_len keys, or with causal the keys up
// to its own position (bottom-right aligned: the sequence's q_len query
// tokens are its last q_len keys). docs/mla.md has the shapes, FlashInfer's
// and vLLM's calls, and the precision of each path.
#ifndef RPA_MLA_H_
#define RPA_MLA_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "rpa/export.h"
#include "rpa/dtype.h"
#include "rpa/tensor.h"

namespace rpa {

namespace internal {
struct MlaPlanState;
}  // namespace internal

// FlashInfer's MLA page table, every array int32, all batch_size sequences
// live:
//   sequence i's query rows  [qo_indptr[i], qo_indptr[i+1])
//   its pages                kv_indices[kv_indptr[i] .. kv_indptr[i+1]), in order
//   its keys                 kv_len_arr[i]: the first kv_len of its pages' slots
// Checked at plan time: both indptrs start at 0 and never decrease,
// kv_indptr[batch_size] <= kv_indices.shape[0], 0 <= q_len <= kv_len <=
// pages * page_size, and every page the sequence reads (the first
// ceil(kv_len / page_size)) in [0, num_pages).
struct MlaPageTable {
  TensorView qo_indptr;   // i32[batch_size + 1]
  TensorView kv_indptr;   // i32[batch_size + 1]
  TensorView kv_indices;  // i32[>= kv_indptr[batch_size]]
  TensorView kv_len_arr;  // i32[batch_size]
};

// The extents and dtypes of the runs' tensors: q_nope [num_tokens,
// num_heads, head_dim_ckv], q_pe [num_tokens, num_heads, head_dim_kpe] and
// out (like q_nope) of q_dtype, num_tokens = qo_indptr[batch_size]; the
// caches ckv [num_pages, page_size, head_dim_ckv] and kpe [num_pages,
// page_size, head_dim_kpe] of kv_dtype.
struct MlaShape {
  int64_t num_heads = 0;        // 1..128.
  int64_t head_dim_ckv = 512;   // A multiple of 16 in [16, 1024].
  int64_t head_dim_kpe = 64;    // A multiple of 16 in [16, 256].
  int64_t page_size = 0;
  int64_t num_pages = 0;        // Every page index read must be below it.
  DType q_dtype = DType::kBF16;   // float32, bfloat16, float16.
  DType kv_dtype = DType::kBF16;  // float32, bfloat16, float16, float8_e4m3fn.
  bool operator==(const MlaShape&) const = default;
};

struct MlaOptions {
  bool causal = false;
  double sm_scale = 1.0;  // Finite.
  std::optional<int> num_threads;  // None: RPA_NUM_THREADS, else every core.
};

// What each run takes beyond its tensors.
struct MlaRunExtras {
  std::optional<MutableTensorView> lse;  // f32 [num_tokens, num_heads], written (natural log).
  // The caches' dequantization scale (vLLM's fp8 MLA cache: value = code *
  // scale); positive and finite. Any kv_dtype may carry one.
  double kv_scale = 1.0;
};

// Several threads may Run one plan at once; Plan must not run concurrently
// with Run on the same object. Once warm (a second run of the same shape),
// Plan reuses its storage and Run allocates nothing.
class RPA_EXPORT MlaPlan {
 public:
  MlaPlan();
  ~MlaPlan();
  MlaPlan(MlaPlan&&) noexcept;
  MlaPlan& operator=(MlaPlan&&) noexcept;
  MlaPlan(const MlaPlan&) = delete;
  MlaPlan& operator=(const MlaPlan&) = delete;

  // Validates the shape, the options and the page table (rpa::Error naming
  // the argument; on error the plan is as it was), copies what runs read (the
  // caller may free its arrays afterwards) and builds the balanced tasks,
  // splitting long sequences' keys when the batch has too few for the threads.
  void Plan(const MlaShape& shape, const MlaPageTable& page_table, const MlaOptions& options);

  // Checks the views against the plan (shapes, dtypes, innermost strides:
  // other strides are free, so ckv and kpe may be slices of vLLM's combined
  // cache [num_blocks, block_size, head_dim_ckv + head_dim_kpe]); on error
  // rpa::Error and nothing written. Then computes out (and extras.lse).
  //   q_nope    [num_tokens, num_heads, head_dim_ckv] of q_dtype
  //   q_pe      [num_tokens, num_heads, head_dim_kpe] of q_dtype
  //   ckv_cache [num_pages, page_size, head_dim_ckv]  of kv_dtype
  //   kpe_cache [num_pages, page_size, head_dim_kpe]  of kv_dtype
  //   out       [num_tokens, num_heads, head_dim_ckv] of q_dtype
  void Run(const TensorView& q_nope, const TensorView& q_pe, const TensorView& ckv_cache,
           const TensorView& kpe_cache, const MutableTensorView& out,
           const MlaRunExtras& extras = {}) const;

  bool planned() const;
  MlaShape shape() const;   // Default values before the first Plan.
  int64_t num_tokens() const;  // qo_indptr[batch_size].
  int64_t num_seqs() const;
  int num_threads() const;
  bool causal() const;
  // The kernel the runs use, e.g. "mla_avx512_bf16_pairs", and the tasks:
  // "mla_avx512_bf16_pairs; 32 tasks, 0 split".
  std::string DescribeKernels() const;

 private:
  std::unique_ptr<internal::MlaPlanState> state_;  // The current plan; null before the first.
  std::unique_ptr<internal::MlaPlanState> spare_;  // Where the next Plan is built, then swapped.
};

}  // namespace rpa

#endif  // RPA_MLA_H_
