// One ragged paged attention call built from fuzzer bytes, shared by the
// ragged and the fused KV-write fuzzers: small tensors of seeded unit-normal
// data, metadata and options chosen by the fuzzer (raw values included), an
// optional static perturbation, and an independent model of whether the
// library must reject the call.
#ifndef RPA_FUZZ_RAGGED_CASE_H_
#define RPA_FUZZ_RAGGED_CASE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "rpa/attention.h"
#include "rpa/options.h"
#include "rpa/tensor.h"

namespace rpa::fuzz {

enum class Layout { kCombined, kNHD, kHND };

// Static perturbations: each makes the call invalid (kQStride only when
// head_dim > 1).
enum class Perturb {
  kNone,
  kKvLensShape,    // kv_lens one entry too many.
  kCuQLensShape,   // cu_q_lens one entry short.
  kNumSeqsShape,   // num_seqs.shape = (2,).
  kOutDtype,       // out in another float dtype than q.
  kQStride,        // q's head_dim not contiguous.
  kKvLensDtype,    // kv_lens as int64.
  kQDtype,         // q (and out) as int8.
  kCacheShape,     // combined: odd head count; split: v_pages one page more.
  kLseShape,       // lse one row too many.
  kSinksDtype,     // sinks as bfloat16.
  kCount,
};

struct RaggedCase {
  Layout layout = Layout::kCombined;
  DType q_dtype = DType::kF32;
  DType kv_dtype = DType::kF32;
  int64_t num_tokens = 0, num_q_heads = 1, num_kv_heads = 1, head_dim = 1;
  int64_t num_pages = 0, page_size = 1, max_num_seqs = 0, pages_per_seq = 0;
  int64_t pi_row_stride = 0;  // page_indices row stride (>= pages_per_seq).
  std::vector<int32_t> kv_lens;       // [max_num_seqs (+1)]
  std::vector<int32_t> page_indices;  // [max_num_seqs, pi_row_stride]
  std::vector<int32_t> cu_q_lens;     // [max_num_seqs + 1]
  std::vector<int32_t> num_seqs;      // [1] (or [2])
  std::vector<int64_t> kv_lens64;     // kKvLensDtype only.
  AttentionOptions options;           // sinks / lse / mask / slopes bound by the views below.
  bool want_sinks = false, want_lse = false;
  bool want_mask = false, want_alibi = false;
  std::vector<uint8_t> mask;          // Flat custom mask (one byte per key).
  std::vector<float> alibi_slopes;    // [num_q_heads]
  bool sane = true;       // Numeric options where the contract's tolerances hold.
  bool nan_mode = false;  // NaN / inf injected where every reader sees it.
  Perturb perturb = Perturb::kNone;

  // Geometry (elements).
  int64_t q_offset = 0, q_pad = 0, out_offset = 0, out_pad = 0, cache_offset = 0, page_pad = 0;
  Buffer q;      // [num_tokens, num_q_heads, head_dim] with q_pad per token.
  Buffer k, v;   // The cache; combined: k only.
  std::vector<float> sinks;       // [num_q_heads]
  std::vector<uint16_t> sinks16;  // kSinksDtype.

  std::string injected;  // nan_mode: what went where.

  bool expect_error = false;
  std::string expect_reason;

  // Views.
  TensorView Q() const;
  TensorView K() const;  // kv_pages for combined.
  TensorView V() const;
  TensorView KvLens() const;
  TensorView PageIndices() const;
  TensorView CuQLens() const;
  TensorView NumSeqs() const;
  DType OutDtype() const;
  Buffer NewOut() const;  // Sentinel-filled.
  MutableTensorView OutView(Buffer& out) const;
  std::vector<float> NewLse() const;  // Sentinel-filled.
  MutableTensorView LseView(std::vector<float>& lse) const;
  // Options with sinks and lse bound (lse may be null when !want_lse).
  AttentionOptions BoundOptions(std::vector<float>* lse) const;

  // Offset in elements of (page, slot, kv head) of K (v = false) or V.
  int64_t CacheOffset(int64_t page, int64_t slot, int64_t head, bool v) const;
  int64_t CacheElements() const;  // Of k (and of v, less its extra page).
  int64_t QLen(int64_t seq) const { return int64_t{cu_q_lens[seq + 1]} - cu_q_lens[seq]; }
  // Whether the call is causal (docs/contract.md §1.6: none is causal unless a mask is given).
  bool Causal() const { return options.causal.value_or(!want_mask); }
  // Whether every query row of sequence seq keeps key t (always without a
  // mask; the caller has checked the metadata).
  bool KeptByAll(int64_t seq, int64_t t) const;
  std::string Describe() const;
};

inline constexpr uint8_t kSentinel = 0xA5;

// Builds a case from the fuzzer's bytes. `new_rows` reserves the fused KV
// write's perturbations (none here).
RaggedCase MakeRaggedCase(Input& in);

// Whether each live sequence's new tokens fit in its kv_len (the fused KV
// write's rule, whatever causal is).
bool NewTokensFit(const RaggedCase& c);

// Runs the combined or split entry point (reference or library).
void CallRagged(const RaggedCase& c, bool reference, const AttentionOptions& options,
                const MutableTensorView& out);

// Whether an output of this case must match the reference within tolerance,
// and the tolerances.
double AbsTolerance(const RaggedCase& c);
double RelTolerance(const RaggedCase& c);

}  // namespace rpa::fuzz

#endif  // RPA_FUZZ_RAGGED_CASE_H_
