// Random serving steps: the inputs of one ragged paged attention call, built
// the way a serving engine's scheduler would (pages scattered in random
// order, the page table padded with garbage, pages beyond each kv_len filled
// with NaN). Shared by the demo, the benchmarks and the tests.
#ifndef RPA_TESTING_SYNTHETIC_BATCH_H_
#define RPA_TESTING_SYNTHETIC_BATCH_H_

#include <cstdint>
#include <vector>

#include "rpa/attention.h"
#include "rpa/dtype.h"
#include "rpa/tensor.h"

namespace rpa::testing {

struct SequenceShape {
  int32_t q_len = 1;
  int32_t kv_len = 1;
};

struct BatchSpec {
  int64_t num_q_heads = 32;
  int64_t num_kv_heads = 8;
  int64_t head_dim = 128;
  int64_t page_size = 16;
  DType q_dtype = DType::kBF16;
  DType kv_dtype = DType::kBF16;
  std::vector<SequenceShape> sequences;
  int64_t max_num_seqs = 0;            // 0: sequences.size().
  int64_t pages_per_seq = 0;           // 0: enough for the longest sequence.
  int64_t max_num_batched_tokens = 0;  // 0: the total q_len; more adds padding rows.
  int64_t spare_pages = 3;             // Pages no sequence uses.
  bool nan_beyond_kv_len = true;       // Poison slots past kv_len and unused pages.
  uint64_t seed = 1;
};

// Owns the buffers; views are row-major contiguous.
struct SyntheticBatch {
  BatchSpec spec;
  int64_t total_num_pages = 0;
  int64_t num_tokens = 0;
  int64_t pages_per_seq = 0;  // spec.pages_per_seq, or what the longest sequence needs.
  std::vector<uint8_t> q;         // [num_tokens, num_q_heads, head_dim]
  std::vector<uint8_t> kv_pages;  // [total_num_pages, page_size, 2 * num_kv_heads, head_dim]
  std::vector<int32_t> kv_lens;       // [max_num_seqs]
  std::vector<int32_t> page_indices;  // [max_num_seqs, pages_per_seq]
  std::vector<int32_t> cu_q_lens;     // [max_num_seqs + 1]
  std::vector<int32_t> num_seqs;      // [1]

  TensorView Q() const;
  TensorView KvPages() const;
  TensorView KvLens() const;
  TensorView PageIndices() const;
  TensorView CuQLens() const;
  TensorView NumSeqs() const;
  // A zero-filled output buffer of q's shape and dtype, and its view.
  std::vector<uint8_t> NewOutput() const;
  MutableTensorView OutView(std::vector<uint8_t>& out) const;
  int64_t TotalQTokens() const { return cu_q_lens[num_seqs[0]]; }
};

SyntheticBatch MakeSyntheticBatch(const BatchSpec& spec);

// Strided views of a combined cache [P, S, 2 * H, D] as the other layouts
// see the same keys and values: NHD and HND separate caches, and JAX's
// paged_attention [H, P, S, D].
struct CacheViews {
  TensorView k_nhd, v_nhd, k_hnd, v_hnd, k_paged, v_paged;
};
CacheViews ViewsOf(const TensorView& kv);

// Max |a - b| over two outputs of the batch's shape and q dtype; NaN if
// either holds a NaN.
double MaxAbsDifference(const SyntheticBatch& batch, const std::vector<uint8_t>& a,
                        const std::vector<uint8_t>& b);

// Max over elements of |a - b| / (tolerance + one unit in the last place of
// the output dtype at |b|, OutputUlp in testing/tolerance.h, f32 outputs
// included): <= 1 when a agrees with the reference b within docs/contract.md §1's
// tolerance (KvTolerance), allowing each side's final rounding to q's dtype
// (one bf16 ulp at 2.0 is 0.0156). NaN if either holds a NaN.
double ToleranceRatio(const SyntheticBatch& batch, const std::vector<uint8_t>& a,
                      const std::vector<uint8_t>& b, double tolerance);

// The same over `count` elements of `dtype` at a and b (b the reference).
double ToleranceRatio(DType dtype, const void* a, const void* b, int64_t count, double tolerance);

}  // namespace rpa::testing

#endif  // RPA_TESTING_SYNTHETIC_BATCH_H_
