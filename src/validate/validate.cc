// Every check of docs/contract.md §3, in JAX's order where JAX has the check. Each
// message names the argument and its value in Python's `name=value`
// spelling, then says how to fix it.
#include "rpa/validate.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "format.h"
#include "threads/cpu_binding.h"
#include "validate/validate_internal.h"

namespace rpa::internal {

// The checks of one view, shared with the other entry points
// (validate_internal.h).

void CheckNonNegativeExtents(const TensorView& t, std::string_view name) {
  for (int d = 0; d < t.rank; ++d) {
    RPA_CHECK(t.shape[d] >= 0, ErrorKind::kShape,
              StrCat(name, ".shape=", t.ShapeString(), " must not have a negative dimension."),
              StrCat("Pass a valid view of ", name, "."));
  }
}

void CheckAligned(const TensorView& t, std::string_view name) {
  const size_t size = SizeOf(t.dtype);
  RPA_CHECK(reinterpret_cast<uintptr_t>(t.data) % size == 0, ErrorKind::kLayout,
            StrCat(name, " must be aligned to its ", static_cast<int64_t>(size),
                   "-byte elements; its data starts at an address that is not."),
            StrCat("Pass ", name, " in a buffer aligned to its dtype (a copy is), not at an odd "
                   "byte offset."));
}

void CheckInnermostContiguous(const TensorView& t, std::string_view name) {
  CheckAligned(t, name);
  if (t.rank == 0) return;
  const int last = t.rank - 1;
  if (t.shape[last] <= 1) return;
  std::string strides = "(";
  for (int d = 0; d < t.rank; ++d) strides += (d ? ", " : "") + std::to_string(t.strides[d]);
  strides += t.rank == 1 ? ",)" : ")";
  RPA_CHECK(t.strides[last] == 1, ErrorKind::kLayout,
            StrCat(name, " must be contiguous in its last dimension; got ", name,
                   ".strides=", strides, " (in elements)."),
            StrCat("Pass a view of ", name,
                   " whose last stride is 1 (other strides are free), or a contiguous copy."));
}

void CheckRank(const TensorView& t, std::string_view name, int rank, std::string_view dims) {
  RPA_CHECK(t.rank == rank, ErrorKind::kShape,
            StrCat(name, ".shape=", t.ShapeString(), " must have ", rank, " dimensions ", dims,
                   "."),
            StrCat("Pass ", name, " as a ", rank, "-dimensional array ", dims, "."));
  CheckNonNegativeExtents(t, name);
}

void CheckLse(const MutableTensorView& lse, const LseShape& want) {
  RPA_CHECK(lse.rank == 2 && lse.shape[0] == want.tokens.value && lse.shape[1] == want.heads.value,
            ErrorKind::kShape,
            StrCat("lse.shape=", lse.ShapeString(), " must be (",
                   NameEq(want.tokens.name, want.tokens.value), ", ",
                   NameEq(want.heads.name, want.heads.value), ")."),
            want.fix);
  RPA_CHECK(lse.dtype == DType::kF32, ErrorKind::kDtype,
            StrCat("lse.dtype=", PyRepr(lse.dtype), " must be float32."),
            "Allocate lse as float32.");
  CheckInnermostContiguous(lse, "lse");
}

namespace {

constexpr int kMaxThreads = 256;
constexpr std::string_view kQDtypes = "float32, bfloat16, float16";
constexpr std::string_view kKvDtypes =
    "float32, bfloat16, float16, float8_e4m3fn, float8_e5m2, int8";

bool IsQDtype(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }
bool IsKvDtype(DType d) {
  return IsQDtype(d) || d == DType::kF8E4M3FN || d == DType::kF8E5M2 || d == DType::kI8;
}

void CheckPositiveExtent(int64_t extent, std::string_view name, std::string_view fix) {
  RPA_CHECK(extent > 0, ErrorKind::kShape, StrCat(NameEq(name, extent), " must be positive."),
            fix);
}

void CheckFinite(const std::optional<double>& value, std::string_view name) {
  if (!value) return;
  RPA_CHECK(std::isfinite(*value), ErrorKind::kOption,
            StrCat(NameEq(name, *value), " must be finite."),
            StrCat("Pass a finite float for ", name, ", or None to leave it out."));
}

void CheckDtype(const TensorView& t, std::string_view name, bool supported,
                std::string_view allowed) {
  RPA_CHECK(supported, ErrorKind::kDtype,
            StrCat(name, ".dtype=", PyRepr(t.dtype), " is not supported; ", name,
                   " must be one of ", allowed, "."),
            StrCat("Cast ", name, " to one of these dtypes."));
}

void CheckMaskValue(double mask_value, std::string_view name) {
  RPA_CHECK(!std::isnan(mask_value) && mask_value != INFINITY, ErrorKind::kOption,
            StrCat(NameEq(name, mask_value), " must not be NaN or +inf."),
            StrCat("Pass a large negative float (JAX's DEFAULT_MASK_VALUE is ",
                   kDefaultMaskValue, ") or -inf, or None for the default."));
}

// The custom mask's view (docs/contract.md §1.6): one form, a byte array,
// instead of the causal mask and a window. Its size is checked when copied.
AttentionProblem::MaskInput CheckCustomMask(const AttentionOptions& options) {
  if (!options.custom_mask && !options.packed_custom_mask) return {};
  RPA_CHECK(!(options.custom_mask && options.packed_custom_mask), ErrorKind::kOption,
            "custom_mask and packed_custom_mask are the same mask in two forms; pass one.",
            "Pass custom_mask (one bool per key) or packed_custom_mask (its bits, "
            "FlashInfer's segment_packbits(..., bitorder='little')).");
  const bool packed = options.packed_custom_mask.has_value();
  const TensorView& mask = packed ? *options.packed_custom_mask : *options.custom_mask;
  const std::string_view name = packed ? "packed_custom_mask" : "custom_mask";
  RPA_CHECK(mask.rank == 1, ErrorKind::kShape,
            StrCat(name, ".shape=", mask.ShapeString(), " must have 1 dimension."),
            "FlashInfer's masks are flat: every sequence's q_len x kv_len block, one after "
            "another.");
  CheckNonNegativeExtents(mask, name);
  RPA_CHECK(mask.dtype == DType::kU8, ErrorKind::kDtype,
            StrCat(name, ".dtype=", PyRepr(mask.dtype), " must be ",
                   packed ? "uint8." : "uint8 (bool as bytes)."),
            packed ? "Pack the bits into uint8 bytes." : "Pass one byte per key, 0 to mask it.");
  CheckInnermostContiguous(mask, name);
  RPA_CHECK(!options.causal.value_or(false), ErrorKind::kOption,
            StrCat("causal=True and ", name, " are two masks; the custom mask replaces the "
                   "causal one."),
            StrCat("Pass causal=None (or False) with ", name,
                   ", and set the causal keys in the mask if they are wanted."));
  RPA_CHECK(!options.sliding_window, ErrorKind::kOption,
            StrCat(NameEq("sliding_window", options.sliding_window.value_or(0)),
                   " must be None with ", name, "."),
            "Clear the keys outside the window in the mask instead.");
  return {/*present=*/true, static_cast<const uint8_t*>(mask.data), mask.shape[0], packed};
}

// A window counts back from each row's causal position: without the
// causal alignment it has nothing to count from.
void CheckCausal(const AttentionOptions& options) {
  if (!options.sliding_window) return;
  RPA_CHECK(options.causal.value_or(true), ErrorKind::kOption,
            StrCat(NameEq("sliding_window", *options.sliding_window),
                   " must be None when causal=False."),
            "A window keeps the keys just before each query's causal position; with "
            "causal=False every row sees all of its keys. Pass causal=True with the window, or "
            "no window.");
}

void CheckThreads(const std::optional<int>& num_threads) {
  // An invalid RPA_CPU_BIND fails the first call (and every one after), here,
  // before anything is written.
  ProcessCpuBinding().Check();
  if (!num_threads) return;
  RPA_CHECK(*num_threads > 0, ErrorKind::kOption,
            StrCat(NameEq("num_threads", *num_threads), " must be positive."),
            "Pass None to use RPA_NUM_THREADS or every core, or a thread count >= 1.");
}

// The cache as [num_pages, page_size, num_kv_heads, head_dim] through strides.
void DescribeCache(const RaggedInputs& in, AttentionProblem& p) {
  const TensorView& k = in.k_pages;
  const TensorView& v = in.v_pages;
  auto view = [](const TensorView& t, int page_dim, int slot_dim, int head_dim_index,
                 int64_t head_step, int64_t first_head) {
    PagesView pages;
    pages.page_stride = t.strides[page_dim];
    pages.slot_stride = t.strides[slot_dim];
    pages.head_stride = t.strides[head_dim_index] * head_step;
    // A plan's views have no data (ShapeInputs): they stay null.
    pages.data = t.data == nullptr ? nullptr
                                   : static_cast<const char*>(t.data) +
                                         first_head * t.strides[head_dim_index] *
                                             static_cast<int64_t>(SizeOf(t.dtype));
    return pages;
  };
  switch (in.layout) {
    case CacheLayout::kCombined:  // [pages, page_size, 2 * kv_heads, head_dim]
      p.num_pages = k.shape[0];
      p.page_size = k.shape[1];
      p.num_kv_heads = k.shape[2] / 2;
      p.k = view(k, 0, 1, 2, 2, 0);
      p.v = view(k, 0, 1, 2, 2, 1);
      break;
    case CacheLayout::kNHD:  // [pages, page_size, kv_heads, head_dim]
      p.num_pages = k.shape[0];
      p.page_size = k.shape[1];
      p.num_kv_heads = k.shape[2];
      p.k = view(k, 0, 1, 2, 1, 0);
      p.v = view(v, 0, 1, 2, 1, 0);
      break;
    case CacheLayout::kHND:  // [pages, kv_heads, page_size, head_dim]
      p.num_pages = k.shape[0];
      p.page_size = k.shape[2];
      p.num_kv_heads = k.shape[1];
      p.k = view(k, 0, 2, 1, 1, 0);
      p.v = view(v, 0, 2, 1, 1, 0);
      break;
  }
  p.head_dim = k.shape[3];
  p.kv_dtype = k.dtype;
}

void BindMetadata(const TensorView& kv_lens, const TensorView& page_indices,
                  const TensorView& cu_q_lens, AttentionProblem& p) {
  p.kv_lens = static_cast<const int32_t*>(kv_lens.data);
  p.page_indices = static_cast<const int32_t*>(page_indices.data);
  p.page_indices_row_stride = page_indices.strides[0];
  p.cu_q_lens = static_cast<const int32_t*>(cu_q_lens.data);
}

// A float32 [num_q_heads] option (sinks, alibi_slopes): its shape, dtype
// and layout; returns its values.
const float* CheckPerHead(const TensorView& t, std::string_view name, std::string_view what,
                          const AttentionProblem& p) {
  RPA_CHECK(t.rank == 1 && t.shape[0] == p.num_q_heads, ErrorKind::kShape,
            StrCat(name, ".shape=", t.ShapeString(), " must be (",
                   NameEq("num_q_heads", p.num_q_heads), ",)."),
            StrCat("Pass one ", what, " per q head, or None for no ", name, "."));
  RPA_CHECK(t.dtype == DType::kF32, ErrorKind::kDtype,
            StrCat(name, ".dtype=", PyRepr(t.dtype), " must be float32."),
            StrCat("Cast ", name, " to float32."));
  CheckInnermostContiguous(t, name);
  return static_cast<const float*>(t.data);
}

void BindAlibi(const TensorView& slopes, AttentionProblem& p) {
  const float* values = CheckPerHead(slopes, "alibi_slopes", "slope", p);
  for (int64_t h = 0; h < p.num_q_heads; ++h) {
    RPA_CHECK(std::isfinite(values[h]), ErrorKind::kOption,
              StrCat("alibi_slopes[", h, "]=", static_cast<double>(values[h]),
                     " must be finite."),
              "Pass the model's ALiBi slopes (e.g. 2^(-8 (h + 1) / num_q_heads)), 0 for a head "
              "without a bias.");
  }
  p.alibi_slopes = values;
}

void BindSinks(const TensorView& sinks, AttentionProblem& p) {
  const float* values = CheckPerHead(sinks, "sinks", "sink logit", p);
  for (int64_t h = 0; h < p.num_q_heads; ++h) {
    RPA_CHECK(!std::isnan(values[h]) && values[h] != INFINITY, ErrorKind::kOption,
              StrCat("sinks[", h, "]=", static_cast<double>(values[h]), " must not be NaN or +inf."),
              "Pass a finite logit, or -inf for a head without a sink.");
  }
  p.sinks = values;
}

void BindLse(const MutableTensorView& lse, AttentionProblem& p) {
  CheckLse(lse, {{"max_num_batched_tokens", p.num_tokens}, {"num_q_heads", p.num_q_heads},
                 "Allocate lse with one float32 per q row and q head: q.shape[:2]."});
  p.lse = static_cast<float*>(lse.data);
  p.lse_token_stride = lse.strides[0];
}

}  // namespace

RaggedInputs CombinedInputs(const TensorView& q, const TensorView& kv_pages,
                            const PageTable& page_table) {
  return RaggedInputs{q,
                      kv_pages,
                      kv_pages,
                      CacheLayout::kCombined,
                      page_table.kv_lens,
                      page_table.page_indices,
                      page_table.cu_q_lens,
                      page_table.num_seqs};
}

RaggedInputs SplitInputs(const TensorView& q, const KVPages& kv, const PageTable& page_table) {
  return RaggedInputs{q,
                      kv.k_pages,
                      kv.v_pages,
                      kv.layout == KVLayout::kNHD ? CacheLayout::kNHD : CacheLayout::kHND,
                      page_table.kv_lens,
                      page_table.page_indices,
                      page_table.cu_q_lens,
                      page_table.num_seqs};
}

void CheckTensorRanks(const RunInputs& in) {
  const bool combined = in.layout == CacheLayout::kCombined;
  const std::string_view cache_name = combined ? "kv_pages" : "k_pages";
  const std::string_view cache_dims =
      combined ? "[total_num_pages, page_size, 2 * num_kv_heads, head_dim]"
      : in.layout == CacheLayout::kNHD ? "[total_num_pages, page_size, num_kv_heads, head_dim]"
                                       : "[total_num_pages, num_kv_heads, page_size, head_dim]";
  // What JAX's tuple unpacking and asserts would reject.
  CheckRank(in.q, "q", 3, "[max_num_batched_tokens, num_q_heads, head_dim]");
  CheckRank(in.k_pages, cache_name, 4, cache_dims);
  if (!combined) {
    CheckRank(in.v_pages, "v_pages", 4, cache_dims);
    RPA_CHECK(in.k_pages.shape == in.v_pages.shape, ErrorKind::kShape,
              StrCat("k_pages and v_pages must have the same shape. Got ",
                     in.k_pages.ShapeString(), " and ", in.v_pages.ShapeString()),
              "Pass K and V caches of one shape, with the same pages, page size, heads and "
              "head_dim.");
    RPA_CHECK(in.k_pages.dtype == in.v_pages.dtype, ErrorKind::kDtype,
              StrCat("k_pages.dtype=", PyRepr(in.k_pages.dtype), " must be the same as v_pages.dtype=",
                     PyRepr(in.v_pages.dtype), "."),
              "Store K and V in one dtype.");
  } else {
    const int64_t combined_heads = in.k_pages.shape[2];
    RPA_CHECK(combined_heads % 2 == 0, ErrorKind::kShape,
              StrCat(NameEq("num_combined_kv_heads", combined_heads), " (kv_pages.shape[2]) must be even."),
              "In the combined layout head 2h holds K and head 2h + 1 holds V of kv head h; "
              "interleave K and V so kv_pages.shape[2] = 2 * num_kv_heads.");
  }
}

void CheckQHeadDim(int64_t q_head_dim, int64_t head_dim, std::string_view cache_name) {
  RPA_CHECK(q_head_dim == head_dim, ErrorKind::kShape,
            StrCat("Q head_dim ", q_head_dim, " must be the same as that of K/V ", head_dim, "."),
            StrCat("Q, K and V must share one head_dim: q.shape[2] == ", cache_name, ".shape[3]."));
}

void CheckShapeViews(const RunInputs& in) {
  const bool combined = in.layout == CacheLayout::kCombined;
  const std::string_view cache_name = combined ? "kv_pages" : "k_pages";
  CheckTensorRanks(in);
  CheckQHeadDim(in.q.shape[2], in.k_pages.shape[3], cache_name);
  CheckInnermostContiguous(in.q, "q");
  CheckInnermostContiguous(in.k_pages, cache_name);
  if (!combined) CheckInnermostContiguous(in.v_pages, "v_pages");
}

AttentionProblem StaticValidate(const RaggedInputs& in, const AttentionOptions& options) {
  const bool combined = in.layout == CacheLayout::kCombined;
  const std::string_view cache_name = combined ? "kv_pages" : "k_pages";
  CheckTensorRanks(RunInputs{in.q, in.k_pages, in.v_pages, in.layout});
  CheckRank(in.page_indices, "page_indices", 2, "[max_num_seqs, pages_per_seq]");

  AttentionProblem p;
  DescribeCache(in, p);
  p.num_tokens = in.q.shape[0];
  p.num_q_heads = in.q.shape[1];
  p.max_num_seqs = in.page_indices.shape[0];
  p.pages_per_seq = in.page_indices.shape[1];

  CheckPositiveExtent(p.num_q_heads, "num_q_heads",
                      "q must have at least one head: q.shape[1] >= 1.");
  CheckPositiveExtent(p.num_kv_heads, "num_kv_heads",
                      StrCat("The cache must hold at least one kv head: ", cache_name,
                             combined ? ".shape[2] >= 2." : " needs >= 1 kv head."));
  CheckPositiveExtent(p.head_dim, "head_dim", StrCat(cache_name, ".shape[3] must be >= 1."));
  CheckPositiveExtent(p.page_size, "page_size",
                      StrCat("Pages must hold at least one token; fix ", cache_name, "'s page_size dimension."));

  CheckNonNegativeExtents(in.kv_lens, "kv_lens");
  CheckNonNegativeExtents(in.cu_q_lens, "cu_q_lens");

  // JAX's static checks, in JAX's order.
  RPA_CHECK(in.num_seqs.rank == 1 && in.num_seqs.shape[0] == 1, ErrorKind::kShape,
            StrCat("num_seqs.shape=", in.num_seqs.ShapeString(), " must be (1,)"),
            "Pass num_seqs as a one-element int32 array holding the number of live sequences.");
  CheckQHeadDim(in.q.shape[2], p.head_dim, cache_name);
  RPA_CHECK(in.kv_lens.rank == 1 && in.kv_lens.shape[0] == p.max_num_seqs, ErrorKind::kShape,
            StrCat("Expected kv_lens.shape=", in.kv_lens.ShapeString(), " to be (", p.max_num_seqs,
                   ",) where `max_num_seqs` is `page_indices.shape[0]`."),
            "Give kv_lens one entry per row of page_indices.");
  RPA_CHECK(in.cu_q_lens.rank == 1 && in.cu_q_lens.shape[0] == p.max_num_seqs + 1,
            ErrorKind::kShape,
            StrCat("Expected cu_q_lens.shape=", in.cu_q_lens.ShapeString(), " to be (",
                   p.max_num_seqs + 1, ",)  where `max_num_seqs` is `page_indices.shape[0]`."),
            "Give cu_q_lens one entry more than page_indices has rows: cu_q_lens[i] is where "
            "sequence i's queries start.");
  RPA_CHECK(in.kv_lens.dtype == DType::kI32 && in.page_indices.dtype == DType::kI32 &&
                in.cu_q_lens.dtype == DType::kI32,
            ErrorKind::kDtype,
            StrCat("The dtype of `kv_lens`, `page_indices`, and `cu_q_lens` must be int32. Got "
                   "kv_lens.dtype=",
                   PyRepr(in.kv_lens.dtype), ", page_indices.dtype=", PyRepr(in.page_indices.dtype),
                   ", cu_q_lens.dtype=", PyRepr(in.cu_q_lens.dtype), "."),
            "Cast them to int32 (for NumPy: .astype(np.int32)).");
  RPA_CHECK(p.num_q_heads % p.num_kv_heads == 0, ErrorKind::kShape,
            StrCat(NameEq("num_q_heads", p.num_q_heads), " must be divisible by ",
                   NameEq("num_kv_heads", p.num_kv_heads)),
            "Each kv head must serve the same number of q heads (GQA): choose num_q_heads as a "
            "multiple of num_kv_heads.");
  if (options.sliding_window) {
    RPA_CHECK(*options.sliding_window > 0, ErrorKind::kOption,
              StrCat(NameEq("sliding_window", *options.sliding_window), " must be positive."),
              "Pass the number of keys each query sees (its own position included), or None for "
              "no window.");
  }
  CheckCausal(options);
  if (options.soft_cap) {
    RPA_CHECK(*options.soft_cap != 0.0, ErrorKind::kOption,
              StrCat(NameEq("soft_cap", *options.soft_cap), " must not be 0.0."),
              "Pass the cap c of c * tanh(logit / c) (e.g. 50.0), or None for no soft cap.");
  }
  if (options.num_kv_pages_per_block) {
    const int64_t blocks = *options.num_kv_pages_per_block;
    RPA_CHECK(blocks > 0 && blocks <= p.pages_per_seq, ErrorKind::kBlockSize,
              StrCat(NameEq("num_kv_pages_per_block", blocks), " must be in range (0, ",
                     p.pages_per_seq, "]."),
              StrCat("Pass None to let the library choose, or at most pages_per_seq = ",
                     in.pages_per_seq_name, " = ", p.pages_per_seq,
                     "; pages_per_seq depends on page_size (ceil(max_model_len / page_size)), "
                     "so a value tuned for another page size will not fit."));
  }
  if (options.num_queries_per_block) {
    RPA_CHECK(*options.num_queries_per_block > 0, ErrorKind::kBlockSize,
              StrCat(NameEq("num_queries_per_block", *options.num_queries_per_block),
                     " must be positive."),
              "Pass None to let the library choose, or a query-tile size >= 1.");
  }
  if (options.vmem_limit_bytes) {
    RPA_CHECK(*options.vmem_limit_bytes > 0, ErrorKind::kOption,
              StrCat(NameEq("vmem_limit_bytes", *options.vmem_limit_bytes), " must be positive."),
              "Pass None for no limit, or a per-worker scratch budget in bytes.");
  }

  // Ours, where JAX asserts or is silent.
  RPA_CHECK(in.num_seqs.dtype == DType::kI32, ErrorKind::kDtype,
            StrCat("num_seqs.dtype=", PyRepr(in.num_seqs.dtype), " must be int32."),
            "Cast num_seqs to int32.");
  CheckDtype(in.q, "q", IsQDtype(in.q.dtype), kQDtypes);
  CheckDtype(in.k_pages, cache_name, IsKvDtype(in.k_pages.dtype), kKvDtypes);
  CheckFinite(options.sm_scale, "sm_scale");
  CheckFinite(options.soft_cap, "soft_cap");
  CheckFinite(options.k_scale, "k_scale");
  CheckFinite(options.v_scale, "v_scale");
  if (options.mask_value) CheckMaskValue(*options.mask_value, "mask_value");
  CheckThreads(options.num_threads);
  CheckInnermostContiguous(in.q, "q");
  CheckInnermostContiguous(in.k_pages, cache_name);
  if (!combined) CheckInnermostContiguous(in.v_pages, "v_pages");
  CheckInnermostContiguous(in.kv_lens, "kv_lens");
  CheckInnermostContiguous(in.page_indices, "page_indices");
  CheckInnermostContiguous(in.cu_q_lens, "cu_q_lens");
  CheckAligned(in.num_seqs, "num_seqs");
  if (options.sinks) BindSinks(*options.sinks, p);
  if (options.lse) BindLse(*options.lse, p);
  if (options.alibi_slopes) BindAlibi(*options.alibi_slopes, p);
  p.mask_input = CheckCustomMask(options);

  p.q_dtype = in.q.dtype;
  p.q = in.q.data;
  p.q_token_stride = in.q.strides[0];
  p.q_head_stride = in.q.strides[1];
  BindMetadata(in.kv_lens, in.page_indices, in.cu_q_lens, p);
  p.sm_scale = static_cast<float>(options.sm_scale);
  p.mask_value = static_cast<float>(options.mask_value.value_or(kDefaultMaskValue));
  p.soft_cap = static_cast<float>(options.soft_cap.value_or(0.0));
  // kv_len fits in int32, so a wider window masks nothing: it is no window.
  p.sliding_window = options.sliding_window.value_or(0) > INT32_MAX ? 0 : options.sliding_window.value_or(0);
  p.causal = options.causal.value_or(!p.mask_input.present);
  p.k_scale = static_cast<float>(options.k_scale.value_or(1.0));
  p.v_scale = static_cast<float>(options.v_scale.value_or(1.0));
  p.num_kv_pages_per_block = options.num_kv_pages_per_block.value_or(0);
  p.num_queries_per_block = options.num_queries_per_block.value_or(0);
  p.vmem_limit_bytes = options.vmem_limit_bytes.value_or(0);
  // A thread count far beyond any machine only costs threads the pool keeps.
  p.num_threads = std::min(options.num_threads.value_or(0), kMaxThreads);
  return p;
}

namespace {

// The custom mask's size for the copied lengths, and its packed copy.
void CopyCustomMask(AttentionProblem& p, MetadataCopy& copy) {
  const AttentionProblem::MaskInput& in = p.mask_input;
  constexpr int64_t kBig = INT64_MAX / 4;  // Saturates the sum: kv_len, q_len < 2^31.
  int64_t needed = 0, bytes = 0;
  copy.mask_begin.resize(static_cast<size_t>(p.num_seqs));
  for (int32_t i = 0; i < p.num_seqs; ++i) {
    const int64_t block =
        static_cast<int64_t>(p.cu_q_lens[i + 1] - p.cu_q_lens[i]) * p.kv_lens[i];
    copy.mask_begin[i] = bytes;
    needed = std::min(needed + (in.packed ? (block + 7) / 8 : block), kBig);
    bytes = std::min(bytes + (block + 7) / 8, kBig);
  }
  const std::string_view name = in.packed ? "packed_custom_mask" : "custom_mask";
  RPA_CHECK(in.size == needed, ErrorKind::kShape,
            StrCat(name, ".shape=(", in.size, ",) must be (", needed, ",): the sum over the live "
                   "sequences of ", in.packed ? "ceil(q_len * kv_len / 8)." : "q_len * kv_len."),
            in.packed ? "Pack each sequence's q_len x kv_len block from its own byte, "
                        "little-endian (FlashInfer's segment_packbits(..., bitorder='little'))."
                      : "Give each sequence's q_len x kv_len block, row-major, one after "
                        "another.");
  copy.mask_bits.assign(static_cast<size_t>(bytes + kMaskPadBytes), 0);
  if (in.packed) {
    std::copy(in.data, in.data + in.size, copy.mask_bits.begin());
  } else {
    int64_t at = 0;  // Into the flat mask.
    for (int32_t i = 0; i < p.num_seqs; ++i) {
      uint8_t* block = copy.mask_bits.data() + copy.mask_begin[i];
      const int64_t count =
          static_cast<int64_t>(p.cu_q_lens[i + 1] - p.cu_q_lens[i]) * p.kv_lens[i];
      for (int64_t b = 0; b < count; ++b) {
        if (in.data[at + b] != 0) block[b / 8] |= static_cast<uint8_t>(1u << (b % 8));
      }
      at += count;
    }
  }
  p.mask_bits = copy.mask_bits.data();
  p.mask_begin = copy.mask_begin.data();
}

}  // namespace

void MetadataCopy::CopyOptionArrays(AttentionProblem& p) {
  if (p.alibi_slopes != nullptr) {
    alibi_slopes.assign(p.alibi_slopes, p.alibi_slopes + p.num_q_heads);
    p.alibi_slopes = alibi_slopes.data();
  }
  if (p.mask_input.present) CopyCustomMask(p, *this);
}

void CheckNonDecreasing(std::string_view name, int64_t i, int32_t before, int32_t after,
                        std::string_view fix) {
  RPA_CHECK(after >= before, ErrorKind::kMetadata,
            StrCat(name, "[", i + 1, "]=", after, " must be greater or equal to ", name, "[", i,
                   "]=", before, "."),
            fix);
}

void CheckTotalQTokens(int64_t total_q_tokens, const AttentionProblem& p, std::string_view fix) {
  RPA_CHECK(total_q_tokens <= p.num_tokens, ErrorKind::kMetadata,
            StrCat("Total q tokens ", total_q_tokens, " must be less or equal to ",
                   NameEq("max_num_batched_tokens", p.num_tokens), "."),
            fix);
}

void CheckQLenAtMostKvLen(int64_t q_len, int64_t kv_len, int64_t seq, std::string_view fix) {
  RPA_CHECK(q_len <= kv_len, ErrorKind::kMetadata,
            StrCat(NameEq("q_len", q_len), " must be less or equal to ", NameEq("kv_len", kv_len),
                   " at sequence ", seq, "."),
            fix);
}

void CopyMetadata(int32_t num_seqs, const MetadataNames& names, AttentionProblem& p,
                  MetadataCopy& copy) {
  RPA_CHECK(num_seqs <= p.max_num_seqs, ErrorKind::kMetadata,
            StrCat("num_seqs[0]=", num_seqs, " must be less or equal to ",
                   NameEq("max_num_seqs", p.max_num_seqs)),
            "num_seqs counts the live rows of page_indices, kv_lens and cu_q_lens; pass at most "
            "page_indices.shape[0].");
  RPA_CHECK(num_seqs >= 0, ErrorKind::kMetadata,
            StrCat("num_seqs[0]=", num_seqs, " must be greater or equal to 0."),
            "Pass the number of live sequences, 0 for an empty batch.");

  // Copied first, then checked: what is checked is what the run reads,
  // whatever the caller writes into its arrays meanwhile or later.
  copy.kv_lens.assign(p.kv_lens, p.kv_lens + num_seqs);
  copy.cu_q_lens.assign(p.cu_q_lens, p.cu_q_lens + num_seqs + 1);
  const int32_t* kv_lens = copy.kv_lens.data();
  const int32_t* cu_q_lens = copy.cu_q_lens.data();

  int64_t max_kv_len = 0;
  for (int32_t i = 0; i < num_seqs; ++i) {
    const int32_t kv_len = kv_lens[i];
    RPA_CHECK(kv_len >= 0, ErrorKind::kMetadata,
              StrCat(names.lens, "[", i, "]=", kv_len, " must be greater or equal to 0."),
              StrCat(names.lens, " holds each sequence's number of tokens in the cache."));
    max_kv_len = std::max<int64_t>(max_kv_len, kv_len);
  }
  // 64-bit: kv_len near INT32_MAX must not overflow the page count.
  const int64_t min_pages_per_seq = (max_kv_len + p.page_size - 1) / p.page_size;
  RPA_CHECK(p.pages_per_seq >= min_pages_per_seq, ErrorKind::kMetadata,
            StrCat(NameEq(names.pages_per_seq, p.pages_per_seq), " must be greater or equal to ",
                   NameEq(StrCat("min_", names.pages_per_seq), min_pages_per_seq), " given ",
                   NameEq("max_kv_len", max_kv_len), " and ", NameEq("page_size", p.page_size),
                   "."),
            "Widen page_indices to ceil(max_kv_len / page_size) columns, or shorten the "
            "sequences.");

  if (names.require_q_len_le_kv_len) {
    RPA_CHECK(cu_q_lens[0] >= 0, ErrorKind::kMetadata,
              StrCat("cu_q_lens[0]=", cu_q_lens[0], " must be greater or equal to 0."),
              "cu_q_lens[i] is the q row where sequence i starts; rows start at 0.");
    for (int32_t i = 0; i < num_seqs; ++i) {
      CheckNonDecreasing("cu_q_lens", i, cu_q_lens[i], cu_q_lens[i + 1],
                         "cu_q_lens is the running sum of the q lengths: it never decreases.");
    }
    CheckTotalQTokens(cu_q_lens[num_seqs], p,
                      "cu_q_lens[num_seqs] counts the q rows in use; make q taller or the batch "
                      "smaller.");
    for (int32_t i = 0; p.causal && i < num_seqs; ++i) {
      CheckQLenAtMostKvLen(static_cast<int64_t>(cu_q_lens[i + 1]) - cu_q_lens[i], kv_lens[i], i,
                           "A sequence's new tokens are part of its history: kv_lens[i] counts "
                           "them too.");
    }
  }

  // The pages each live sequence reads, copied from the caller's padded
  // matrix (p still points at it) and checked as copied.
  int64_t pages_read = 0;
  for (int32_t i = 0; i < num_seqs; ++i) pages_read += (kv_lens[i] + p.page_size - 1) / p.page_size;
  copy.page_indices.clear();
  copy.page_indices.reserve(static_cast<size_t>(pages_read));
  copy.page_begin.resize(static_cast<size_t>(num_seqs) + 1);
  for (int32_t i = 0; i < num_seqs; ++i) {
    copy.page_begin[i] = static_cast<int64_t>(copy.page_indices.size());
    const int64_t columns = (static_cast<int64_t>(kv_lens[i]) + p.page_size - 1) / p.page_size;
    for (int64_t column = 0; column < columns; ++column) {
      const int32_t page = p.PageIndex(i, column);
      RPA_CHECK(page >= 0 && page < p.num_pages, ErrorKind::kPageIndex,
                StrCat("page_indices[", i, ", ", column, "]=", page,
                       " must be in range [0, ", NameEq("total_num_pages", p.num_pages),
                       ") because sequence ", i, " reads it (", names.lens, "[", i,
                       "]=", kv_lens[i], ", ", NameEq("page_size", p.page_size), ")."),
                "Point every page a sequence's kv_len covers at a page of the cache; columns "
                "beyond ceil(kv_len / page_size) are never read and may hold anything.");
      copy.page_indices.push_back(page);
    }
  }
  copy.page_begin[num_seqs] = static_cast<int64_t>(copy.page_indices.size());
  copy.Bind(p);
  p.num_seqs = num_seqs;
  copy.CopyOptionArrays(p);
}

void DynamicValidate(int32_t num_seqs, AttentionProblem& p, const MetadataNames& names) {
  // The checks on a throwaway copy: p keeps reading the caller's arrays.
  MetadataCopy copy;
  AttentionProblem checked = p;
  CopyMetadata(num_seqs, names, checked, copy);
  p.num_seqs = num_seqs;
}

void BindOutput(const TensorView& q, const MutableTensorView& out, AttentionProblem& p) {
  RPA_CHECK(out.rank == q.rank && out.shape == q.shape, ErrorKind::kShape,
            StrCat("out.shape=", out.ShapeString(), " must be the same as q.shape=",
                   q.ShapeString(), "."),
            "Allocate out like q.");
  RPA_CHECK(out.dtype == q.dtype, ErrorKind::kDtype,
            StrCat("out.dtype=", PyRepr(out.dtype), " must be the same as q.dtype=",
                   PyRepr(q.dtype), "."),
            "Allocate out like q.");
  CheckInnermostContiguous(out, "out");
  p.out = out.data;
  p.out_token_stride = out.strides[0];
  p.out_head_stride = out.strides[1];
}

namespace {

// The planned extents of a run's view, as a Python tuple: "(16, 4, 64)".
std::string TupleString(std::initializer_list<int64_t> extents) {
  std::string s = "(";
  for (int64_t e : extents) s += (s.size() > 1 ? ", " : "") + std::to_string(e);
  return s + (extents.size() == 1 ? ",)" : ")");
}

void CheckPlannedShape(const TensorView& t, std::string_view name,
                       std::initializer_list<int64_t> planned, std::string_view dims) {
  bool same = t.rank == static_cast<int>(planned.size());
  int d = 0;
  for (int64_t extent : planned) {
    same = same && t.shape[d] == extent;
    ++d;
  }
  RPA_CHECK(same, ErrorKind::kShape,
            StrCat(name, ".shape=", t.ShapeString(), " must be ", TupleString(planned),
                   " as planned ", dims, "."),
            "Run a plan on tensors of the shapes it was planned for (AttentionShape), or plan "
            "again for these.");
}

void CheckPlannedDtype(const TensorView& t, std::string_view name, DType planned,
                       std::string_view planned_name) {
  RPA_CHECK(t.dtype == planned, ErrorKind::kDtype,
            StrCat(name, ".dtype=", PyRepr(t.dtype), " must be the planned ", planned_name, "=",
                   PyRepr(planned), "."),
            "Run a plan on tensors of the dtypes it was planned for, or plan again for these.");
}

void CheckShapeExtent(int64_t extent, std::string_view name) {
  RPA_CHECK(extent >= INT32_MIN && extent <= INT32_MAX, ErrorKind::kShape,
            StrCat(NameEq(name, extent), " must fit in int32."),
            "An AttentionShape describes tensors in memory: pass their extents (rpa::ShapeOf "
            "reads them from the views).");
}

}  // namespace

RaggedInputs ShapeInputs(const AttentionShape& shape, const PageTable& page_table) {
  CheckShapeExtent(shape.num_tokens, "num_tokens");
  CheckShapeExtent(shape.num_q_heads, "num_q_heads");
  CheckShapeExtent(shape.num_kv_heads, "num_kv_heads");
  CheckShapeExtent(shape.head_dim, "head_dim");
  CheckShapeExtent(shape.num_pages, "num_pages");
  CheckShapeExtent(shape.page_size, "page_size");
  // Views without data: StaticValidate checks their extents and dtypes as
  // it checks real tensors', and never reads them.
  const int64_t tokens = shape.num_tokens == -1 ? kTokensOfPageTable : shape.num_tokens;
  const TensorView q(nullptr, shape.q_dtype, {tokens, shape.num_q_heads, shape.head_dim});
  const int64_t pages = shape.num_pages, slots = shape.page_size, heads = shape.num_kv_heads;
  switch (LayoutOf(shape)) {
    case CacheLayout::kCombined:
      return CombinedInputs(
          q, TensorView(nullptr, shape.kv_dtype, {pages, slots, 2 * heads, shape.head_dim}),
          page_table);
    case CacheLayout::kNHD: {
      const TensorView k(nullptr, shape.kv_dtype, {pages, slots, heads, shape.head_dim});
      return SplitInputs(q, KVPages{k, k, KVLayout::kNHD}, page_table);
    }
    case CacheLayout::kHND:
      break;
  }
  const TensorView k(nullptr, shape.kv_dtype, {pages, heads, slots, shape.head_dim});
  return SplitInputs(q, KVPages{k, k, KVLayout::kHND}, page_table);
}

void CheckPlanOptions(const AttentionOptions& options) {
  RPA_CHECK(!options.sinks, ErrorKind::kOption,
            "options.sinks belongs to each run, not to the plan.",
            "Pass sinks to AttentionPlan::Run in RunExtras::sinks (each layer has its own).");
  RPA_CHECK(!options.lse, ErrorKind::kOption, "options.lse belongs to each run, not to the plan.",
            "Pass lse to AttentionPlan::Run in RunExtras::lse (each layer writes its own).");
}

RunInputs CombinedRun(const TensorView& q, const TensorView& kv_pages) {
  return RunInputs{q, kv_pages, kv_pages, CacheLayout::kCombined};
}

RunInputs SplitRun(const TensorView& q, const KVPages& kv) {
  return RunInputs{q, kv.k_pages, kv.v_pages,
                   kv.layout == KVLayout::kNHD ? CacheLayout::kNHD : CacheLayout::kHND};
}

void BindRun(const RunInputs& in, const MutableTensorView& out, const RunExtras& extras,
             CacheLayout planned_layout, AttentionProblem& p) {
  auto describe = [](CacheLayout layout) {
    return layout == CacheLayout::kCombined ? std::string("JAX's combined kv_pages")
                                            : StrCat("separate K and V caches in the ",
                                                     layout == CacheLayout::kNHD ? "NHD" : "HND",
                                                     " layout");
  };
  RPA_CHECK(in.layout == planned_layout, ErrorKind::kShape,
            StrCat("The cache is ", describe(in.layout), ", but the plan is for ",
                   describe(planned_layout), "."),
            "Run a plan on a cache of the layout it was planned for (AttentionShape::kv_layout), "
            "or plan again for this one.");
  CheckPlannedShape(in.q, "q", {p.num_tokens, p.num_q_heads, p.head_dim},
                    "[max_num_batched_tokens, num_q_heads, head_dim]");
  CheckPlannedDtype(in.q, "q", p.q_dtype, "q_dtype");
  auto split = [&](std::initializer_list<int64_t> planned, std::string_view dims) {
    CheckPlannedShape(in.k_pages, "k_pages", planned, dims);
    CheckPlannedShape(in.v_pages, "v_pages", planned, dims);
  };
  switch (in.layout) {
    case CacheLayout::kCombined:
      CheckPlannedShape(in.k_pages, "kv_pages",
                        {p.num_pages, p.page_size, 2 * p.num_kv_heads, p.head_dim},
                        "[total_num_pages, page_size, 2 * num_kv_heads, head_dim]");
      break;
    case CacheLayout::kNHD:
      split({p.num_pages, p.page_size, p.num_kv_heads, p.head_dim},
            "[total_num_pages, page_size, num_kv_heads, head_dim]");
      break;
    case CacheLayout::kHND:
      split({p.num_pages, p.num_kv_heads, p.page_size, p.head_dim},
            "[total_num_pages, num_kv_heads, page_size, head_dim]");
      break;
  }
  const bool combined = in.layout == CacheLayout::kCombined;
  CheckPlannedDtype(in.k_pages, combined ? "kv_pages" : "k_pages", p.kv_dtype, "kv_dtype");
  if (!combined) CheckPlannedDtype(in.v_pages, "v_pages", p.kv_dtype, "kv_dtype");
  CheckInnermostContiguous(in.q, "q");
  CheckInnermostContiguous(in.k_pages, combined ? "kv_pages" : "k_pages");
  if (!combined) CheckInnermostContiguous(in.v_pages, "v_pages");
  BindOutput(in.q, out, p);
  p.sinks = nullptr;
  p.lse = nullptr;
  if (extras.sinks) BindSinks(*extras.sinks, p);
  if (extras.lse) BindLse(*extras.lse, p);
  CheckFinite(extras.k_scale, "k_scale");
  CheckFinite(extras.v_scale, "v_scale");
  if (extras.k_scale) p.k_scale = static_cast<float>(*extras.k_scale);
  if (extras.v_scale) p.v_scale = static_cast<float>(*extras.v_scale);

  // Everything checked: bind the tensors.
  p.q = in.q.data;
  p.q_token_stride = in.q.strides[0];
  p.q_head_stride = in.q.strides[1];
  RaggedInputs cache;
  cache.k_pages = in.k_pages;
  cache.v_pages = in.v_pages;
  cache.layout = in.layout;
  DescribeCache(cache, p);
}

AttentionProblem ValidateRagged(const RaggedInputs& inputs, const AttentionOptions& options,
                                const MutableTensorView& out) {
  AttentionProblem problem = StaticValidate(inputs, options);
  BindOutput(inputs.q, out, problem);
  DynamicValidate(*static_cast<const int32_t*>(inputs.num_seqs.data), problem);
  return problem;
}

AttentionProblem ValidateRagged(const RaggedInputs& inputs, const AttentionOptions& options,
                                const MutableTensorView& out, MetadataCopy& copy) {
  AttentionProblem problem = StaticValidate(inputs, options);
  BindOutput(inputs.q, out, problem);
  CopyMetadata(*static_cast<const int32_t*>(inputs.num_seqs.data), {}, problem, copy);
  return problem;
}

AttentionProblem StaticValidatePagedAttention(const TensorView& q, const TensorView& k_pages,
                                              const TensorView& v_pages, const TensorView& lengths,
                                              const TensorView& page_indices,
                                              const PagedAttentionOptions& options,
                                              const MutableTensorView& out,
                                              std::vector<int32_t>& cu_q_lens_storage) {
  constexpr std::string_view kCacheDims = "[num_kv_heads, total_num_pages, page_size, head_dim]";
  CheckRank(q, "q", 3, "[batch_size, num_q_heads, head_dim]");
  CheckRank(k_pages, "k_pages", 4, kCacheDims);
  CheckRank(v_pages, "v_pages", 4, kCacheDims);
  CheckRank(page_indices, "page_indices", 2, "[batch_size, pages_per_sequence]");
  CheckNonNegativeExtents(lengths, "lengths");
  const int64_t batch_size = q.shape[0];
  const int64_t num_q_heads = q.shape[1];
  const int64_t head_dim = q.shape[2];
  const int64_t num_kv_heads = k_pages.shape[0];
  const int64_t head_dim_k = k_pages.shape[3];
  const int64_t pages_per_sequence = page_indices.shape[1];

  CheckPositiveExtent(num_q_heads, "num_q_heads", "q must have at least one head: q.shape[1] >= 1.");
  CheckPositiveExtent(num_kv_heads, "num_kv_heads", "k_pages.shape[0] must be >= 1.");
  CheckPositiveExtent(head_dim_k, "head_dim", "k_pages.shape[3] must be >= 1.");
  CheckPositiveExtent(k_pages.shape[2], "page_size", "k_pages.shape[2] must be >= 1.");
  RPA_CHECK(options.pages_per_compute_block > 0, ErrorKind::kBlockSize,
            StrCat(NameEq("pages_per_compute_block", options.pages_per_compute_block),
                   " must be positive."),
            "Pass a divisor of pages_per_sequence = page_indices.shape[1].");

  // JAX's checks, in JAX's order.
  RPA_CHECK(k_pages.shape == v_pages.shape, ErrorKind::kShape,
            StrCat("k_pages and v_pages must have the same shape. Got ", k_pages.ShapeString(),
                   " and ", v_pages.ShapeString()),
            "Pass K and V caches of one shape [num_kv_heads, total_num_pages, page_size, "
            "head_dim].");
  RPA_CHECK(num_q_heads % num_kv_heads == 0, ErrorKind::kShape,
            StrCat("Number of Q heads must be divisible by number of KV heads. Got ", num_q_heads,
                   " and ", num_kv_heads, "."),
            "Each kv head must serve the same number of q heads (GQA).");
  RPA_CHECK(head_dim_k == head_dim, ErrorKind::kShape,
            StrCat("head_dim of Q must be the same as that of K/V. Got ", head_dim, " and ",
                   head_dim_k, "."),
            "Q, K and V must share one head_dim: q.shape[2] == k_pages.shape[3].");
  // JAX's text states this rule backwards; ours says it the right way round.
  RPA_CHECK(pages_per_sequence % options.pages_per_compute_block == 0, ErrorKind::kBlockSize,
            StrCat(NameEq("pages_per_sequence", pages_per_sequence), " must be divisible by ",
                   NameEq("pages_per_compute_block", options.pages_per_compute_block), "."),
            "Pass a divisor of pages_per_sequence = page_indices.shape[1].");
  RPA_CHECK(lengths.rank == 1 && lengths.shape[0] == batch_size, ErrorKind::kShape,
            "`lengths` and `q` must have the same batch size",
            StrCat("Give lengths one entry per row of q (", batch_size, "); got lengths.shape=",
                   lengths.ShapeString(), "."));
  RPA_CHECK(page_indices.shape[0] == batch_size, ErrorKind::kShape,
            "`page_indices` and `q` must have the same batch size",
            StrCat("Give page_indices one row per row of q (", batch_size,
                   "); got page_indices.shape=", page_indices.ShapeString(), "."));
  RPA_CHECK(lengths.dtype == DType::kI32, ErrorKind::kDtype,
            StrCat("The dtype of `lengths` must be int32. Got ", ToString(lengths.dtype)),
            "Cast lengths to int32.");
  if (options.megacore_mode == "kv_head") {
    RPA_CHECK(num_kv_heads % 2 == 0, ErrorKind::kOption,
              "number of KV heads must be even when megacore_mode is 'kv_head'",
              "Pass megacore_mode=None (on CPU it changes nothing).");
  } else if (options.megacore_mode == "batch") {
    RPA_CHECK(batch_size % 2 == 0, ErrorKind::kOption,
              "batch size must be even when megacore_mode is 'batch'",
              "Pass megacore_mode=None (on CPU it changes nothing).");
  } else {
    RPA_CHECK(!options.megacore_mode, ErrorKind::kOption,
              "megacore_mode must be one of ['kv_head', 'batch', None]",
              StrCat("Got megacore_mode='", *options.megacore_mode, "'; pass None on CPU."));
  }

  // Ours.
  RPA_CHECK(page_indices.dtype == DType::kI32, ErrorKind::kDtype,
            StrCat("The dtype of `page_indices` must be int32. Got ", ToString(page_indices.dtype)),
            "Cast page_indices to int32.");
  RPA_CHECK(k_pages.dtype == v_pages.dtype, ErrorKind::kDtype,
            StrCat("k_pages.dtype=", PyRepr(k_pages.dtype), " must be the same as v_pages.dtype=",
                   PyRepr(v_pages.dtype), "."),
            "Store K and V in one dtype.");
  CheckDtype(q, "q", IsQDtype(q.dtype), kQDtypes);
  CheckDtype(k_pages, "k_pages", IsKvDtype(k_pages.dtype), kKvDtypes);
  CheckMaskValue(options.mask_value, "mask_value");
  CheckFinite(options.attn_logits_soft_cap, "attn_logits_soft_cap");
  if (options.attn_logits_soft_cap) {
    RPA_CHECK(*options.attn_logits_soft_cap != 0.0, ErrorKind::kOption,
              StrCat(NameEq("attn_logits_soft_cap", *options.attn_logits_soft_cap),
                     " must not be 0.0."),
              "Pass the cap c of c * tanh(logit / c), or None for no soft cap.");
  }
  CheckThreads(options.num_threads);
  CheckInnermostContiguous(q, "q");
  CheckInnermostContiguous(k_pages, "k_pages");
  CheckInnermostContiguous(v_pages, "v_pages");
  CheckInnermostContiguous(lengths, "lengths");
  CheckInnermostContiguous(page_indices, "page_indices");

  // One query per sequence: token b is sequence b.
  RPA_CHECK(batch_size <= INT32_MAX, ErrorKind::kShape,
            StrCat(NameEq("batch_size", batch_size), " must fit in int32."),
            "Split the batch.");
  cu_q_lens_storage.resize(static_cast<size_t>(batch_size) + 1);
  for (int64_t b = 0; b <= batch_size; ++b) cu_q_lens_storage[b] = static_cast<int32_t>(b);

  AttentionProblem p;
  p.num_tokens = batch_size;
  p.num_q_heads = num_q_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = head_dim;
  p.num_pages = k_pages.shape[1];
  p.page_size = k_pages.shape[2];
  p.max_num_seqs = batch_size;
  p.pages_per_seq = pages_per_sequence;
  p.q_dtype = q.dtype;
  p.q = q.data;
  p.q_token_stride = q.strides[0];
  p.q_head_stride = q.strides[1];
  p.kv_dtype = k_pages.dtype;
  p.k = PagesView{k_pages.data, k_pages.strides[1], k_pages.strides[2], k_pages.strides[0]};
  p.v = PagesView{v_pages.data, v_pages.strides[1], v_pages.strides[2], v_pages.strides[0]};
  BindMetadata(lengths, page_indices, TensorView(cu_q_lens_storage.data(), DType::kI32,
                                                 {batch_size + 1}),
               p);
  p.sm_scale = 1.0f;  // JAX's paged_attention takes q pre-scaled.
  p.mask_value = static_cast<float>(options.mask_value);
  p.soft_cap = static_cast<float>(options.attn_logits_soft_cap.value_or(0.0));
  // The compute block is JAX's KV tile; any divisor of the row fits ours.
  p.num_kv_pages_per_block =
      std::min<int64_t>(options.pages_per_compute_block, std::max<int64_t>(pages_per_sequence, 1));
  p.num_threads = std::min(options.num_threads.value_or(0), kMaxThreads);
  BindOutput(q, out, p);
  return p;
}

}  // namespace rpa::internal

namespace rpa {

void StaticValidateInputs(const TensorView& q, const TensorView& kv_pages,
                          const PageTable& page_table, const AttentionOptions& options) {
  internal::StaticValidate(internal::CombinedInputs(q, kv_pages, page_table), options);
}

void StaticValidateInputs(const TensorView& q, const KVPages& kv, const PageTable& page_table,
                          const AttentionOptions& options) {
  internal::StaticValidate(internal::SplitInputs(q, kv, page_table), options);
}

void DynamicValidateInputs(const TensorView& q, const TensorView& kv_pages,
                           const PageTable& page_table, const AttentionOptions& options) {
  internal::AttentionProblem problem =
      internal::StaticValidate(internal::CombinedInputs(q, kv_pages, page_table), options);
  internal::DynamicValidate(*static_cast<const int32_t*>(page_table.num_seqs.data), problem);
}

void DynamicValidateInputs(const TensorView& q, const KVPages& kv, const PageTable& page_table,
                           const AttentionOptions& options) {
  internal::AttentionProblem problem =
      internal::StaticValidate(internal::SplitInputs(q, kv, page_table), options);
  internal::DynamicValidate(*static_cast<const int32_t*>(page_table.num_seqs.data), problem);
}

}  // namespace rpa
