// Random MLA batches (rpa/mla.h) for the tests and `rpa bench`'s mla-decode
// workload, and the float64 reference they are checked against.
//
// A batch: num_heads q heads, FlashInfer's page table over pages in random
// order, unit-normal q and latents (stored in the batch's dtypes; the
// reference reads the stored values exactly), and NaN in every cache slot
// no sequence reads (the pages left over and the tails of last pages), so a
// kernel that reads past a sequence's keys is caught. The cache is either
// two arrays or vLLM's one combined array [num_pages, page_size,
// head_dim_ckv + head_dim_kpe], passed as its two strided slices.
#ifndef RPA_TESTING_MLA_BATCH_H_
#define RPA_TESTING_MLA_BATCH_H_

#include <cstdint>
#include <vector>

#include "rpa/mla.h"

namespace rpa::testing {

struct MlaSequence {
  int64_t q_len = 1;
  int64_t kv_len = 1;
};

struct MlaBatchSpec {
  int64_t num_heads = 16;
  int64_t head_dim_ckv = 512;
  int64_t head_dim_kpe = 64;
  int64_t page_size = 64;
  DType q_dtype = DType::kBF16;
  DType kv_dtype = DType::kBF16;
  bool combined_cache = false;  // vLLM's one array, sliced.
  int64_t spare_pages = 2;      // Pages no sequence reads (NaN).
  std::vector<MlaSequence> sequences;
  uint32_t seed = 1;
};

struct MlaBatch {
  MlaBatchSpec spec;
  int64_t num_tokens = 0;
  int64_t num_pages = 0;
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, kv_len_arr;
  std::vector<uint8_t> q_nope, q_pe;   // [num_tokens, num_heads, dim] of q_dtype
  std::vector<uint8_t> ckv, kpe;       // Separate caches, or
  std::vector<uint8_t> combined;       // [num_pages, page_size, ckv + kpe] (combined_cache)

  MlaShape Shape() const;
  MlaPageTable PageTable() const;
  TensorView QNope() const;
  TensorView QPe() const;
  TensorView CkvCache() const;  // A strided slice of `combined` with combined_cache.
  TensorView KpeCache() const;
  std::vector<uint8_t> NewOutput() const;  // [num_tokens, num_heads, ckv] of q_dtype, 0xA5.
  MutableTensorView OutView(std::vector<uint8_t>& out) const;
  // Bytes of latents the keys of the batch read (ckv + kpe per key), once each.
  double LatentBytes() const;
};

MlaBatch MakeMlaBatch(const MlaBatchSpec& spec);

// The float64 reference of the absorbed math, written independently of the
// library: per row, every visible key's logit (q_nope . ckv + q_pe . kpe) *
// sm_scale * kv_scale, its softmax, and sum softmax * ckv * kv_scale, from
// the stored values. out [num_tokens, num_heads, ckv] and lse
// [num_tokens, num_heads] (natural log; -inf for a row without keys).
struct MlaReferenceResult {
  std::vector<double> out;
  std::vector<double> lse;
};
MlaReferenceResult MlaReference(const MlaBatch& batch, bool causal, double sm_scale,
                                double kv_scale);

}  // namespace rpa::testing

#endif  // RPA_TESTING_MLA_BATCH_H_
