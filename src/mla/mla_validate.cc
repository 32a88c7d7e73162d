// The checks of an MLA plan and run (mla_validate.h), through the one check
// macro (format.h) and the view checks every entry point shares
// (validate_internal.h), so each message exists once.
#include "mla/mla_validate.h"

#include <cmath>
#include <string>
#include <string_view>

#include "format.h"
#include "threads/cpu_binding.h"
#include "threads/thread_pool.h"
#include "validate/validate_internal.h"

namespace rpa::internal {
namespace {

constexpr std::string_view kQDtypes = "float32, bfloat16, float16";
constexpr std::string_view kKvDtypes = "float32, bfloat16, float16, float8_e4m3fn";

bool IsMlaQDtype(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }
bool IsMlaKvDtype(DType d) { return IsMlaQDtype(d) || d == DType::kF8E4M3FN; }

// A multiple of 16 in [16, most] (the kernels pair dims and pad rows to 16).
void CheckHeadDim(int64_t value, std::string_view name, int64_t most) {
  RPA_CHECK(value >= 16 && value <= most && value % 16 == 0, ErrorKind::kShape,
            StrCat(NameEq(name, value), " must be a multiple of 16 in [16, ", most, "]."),
            "DeepSeek-V2/V3 and Kimi K2 use head_dim_ckv=512 (kv_lora_rank) and "
            "head_dim_kpe=64 (qk_rope_head_dim).");
}

void CheckDtypeName(DType dtype, std::string_view name, bool supported,
                    std::string_view allowed) {
  RPA_CHECK(supported, ErrorKind::kDtype,
            StrCat(name, "=", PyRepr(dtype), " is not supported; ", name, " must be one of ",
                   allowed, "."),
            StrCat("Cast the tensors to one of these dtypes."));
}

void CheckMetadataView(const TensorView& t, std::string_view name, std::string_view dims) {
  CheckRank(t, name, 1, dims);
  RPA_CHECK(t.dtype == DType::kI32, ErrorKind::kDtype,
            StrCat(name, ".dtype=", PyRepr(t.dtype), " must be int32."),
            StrCat("Cast ", name, " to int32 (FlashInfer keeps it as torch.int32)."));
  CheckInnermostContiguous(t, name);
}

void CheckViews(const MlaPageTable& t) {
  CheckMetadataView(t.qo_indptr, "qo_indptr", "[batch_size + 1]");
  CheckMetadataView(t.kv_indptr, "kv_indptr", "[batch_size + 1]");
  CheckMetadataView(t.kv_indices, "kv_indices", "[num_used_pages]");
  CheckMetadataView(t.kv_len_arr, "kv_len_arr", "[batch_size]");
  CheckCsrExtents(t.qo_indptr, t.kv_indptr, t.kv_len_arr, "kv_len_arr");
  const int64_t entries = t.qo_indptr.shape[0];
  RPA_CHECK(entries - 1 <= INT32_MAX, ErrorKind::kShape,
            StrCat(NameEq("batch_size", entries - 1), " must fit in int32."), "Split the batch.");
}

// Copies an indptr array and checks FlashInfer's rule: from 0, never decreasing.
void CopyIndptr(const TensorView& view, std::string_view name, std::string_view what,
                std::vector<int32_t>& into) {
  const auto* values = static_cast<const int32_t*>(view.data);
  into.assign(values, values + view.shape[0]);
  RPA_CHECK(into[0] == 0, ErrorKind::kMetadata, StrCat(name, "[0]=", into[0], " must be 0."),
            StrCat(name, "[i] is where sequence i's ", what, " start; it starts at 0."));
  for (size_t i = 0; i + 1 < into.size(); ++i) {
    if (into[i + 1] >= into[i]) continue;  // The fix is built only for the message.
    CheckNonDecreasing(name, static_cast<int64_t>(i), into[i], into[i + 1],
                       StrCat(name, " is the running sum of the sequences' ", what,
                              ": it never decreases."));
  }
}

// Sequence i's kv_len against its q_len and its pages.
void CheckKvLen(const MlaProblem& p, const MlaMetadata& m, int64_t i) {
  const int64_t kv_len = m.kv_lens[i];
  const int64_t q_len = static_cast<int64_t>(m.cu_q_lens[i + 1]) - m.cu_q_lens[i];
  const int64_t pages = static_cast<int64_t>(m.page_begin[i + 1]) - m.page_begin[i];
  RPA_CHECK(kv_len >= 0, ErrorKind::kMetadata,
            StrCat("kv_len_arr[", i, "]=", kv_len, " must be non-negative."),
            "kv_len_arr[i] counts sequence i's cached tokens, the new ones included.");
  RPA_CHECK(q_len <= kv_len, ErrorKind::kMetadata,
            StrCat(NameEq("q_len", q_len), " (qo_indptr[", i + 1, "] - qo_indptr[", i,
                   "]) must be less or equal to kv_len_arr[", i, "]=", kv_len, "."),
            "A sequence's new tokens are part of its history: kv_len_arr counts them too.");
  RPA_CHECK(kv_len <= pages * p.page_size, ErrorKind::kMetadata,
            StrCat("kv_len_arr[", i, "]=", kv_len, " must be less or equal to ", pages,
                   " pages (kv_indptr[", i + 1, "] - kv_indptr[", i, "]) * ",
                   NameEq("page_size", p.page_size), " = ", pages * p.page_size, "."),
            "Give the sequence ceil(kv_len / page_size) pages or more.");
}

void CheckQueryView(const TensorView& t, std::string_view name, const MlaProblem& p,
                    int64_t dim, std::string_view dim_name) {
  CheckRank(t, name, 3, "[num_tokens, num_heads, head_dim]");
  RPA_CHECK(t.shape[0] == p.num_tokens && t.shape[1] == p.num_heads && t.shape[2] == dim,
            ErrorKind::kShape,
            StrCat(name, ".shape=", t.ShapeString(), " must be (", NameEq("num_tokens", p.num_tokens),
                   ", ", NameEq("num_heads", p.num_heads), ", ", NameEq(dim_name, dim), ")."),
            "num_tokens is the plan's qo_indptr[batch_size]; pass the layer's tensors of the "
            "planned shape, or plan again.");
  RPA_CHECK(t.dtype == p.q_dtype, ErrorKind::kDtype,
            StrCat(name, ".dtype=", PyRepr(t.dtype), " must be the planned ",
                   NameEq("q_data_type", PyRepr(p.q_dtype)), "."),
            "Cast it, or plan with its dtype.");
  CheckInnermostContiguous(t, name);
}

MlaPages CheckCacheView(const TensorView& t, std::string_view name, const MlaProblem& p,
                        int64_t dim, std::string_view dim_name) {
  CheckRank(t, name, 3, "[num_pages, page_size, head_dim]");
  RPA_CHECK(t.shape[0] == p.num_pages && t.shape[1] == p.page_size && t.shape[2] == dim,
            ErrorKind::kShape,
            StrCat(name, ".shape=", t.ShapeString(), " must be (", NameEq("num_pages", p.num_pages),
                   ", ", NameEq("page_size", p.page_size), ", ", NameEq(dim_name, dim), ")."),
            "Pass the planned cache; vLLM's combined cache [num_blocks, block_size, "
            "head_dim_ckv + head_dim_kpe] is passed as its two slices (no copy).");
  RPA_CHECK(t.dtype == p.kv_dtype, ErrorKind::kDtype,
            StrCat(name, ".dtype=", PyRepr(t.dtype), " must be the planned ",
                   NameEq("kv_data_type", PyRepr(p.kv_dtype)), "."),
            "Cast it, or plan with its dtype.");
  CheckInnermostContiguous(t, name);
  return MlaPages{t.data, t.strides[0], t.strides[1]};
}

void BindLse(const MutableTensorView& lse, MlaProblem& p) {
  CheckLse(lse, {{"num_tokens", p.num_tokens}, {"num_heads", p.num_heads},
                 "Allocate lse with one float32 per query token and head: q_nope.shape[:2]."});
  p.lse = static_cast<float*>(lse.data);
  p.lse_stride = lse.strides[0];
}

}  // namespace

MlaProblem ValidateMlaPlan(const MlaShape& shape, const MlaOptions& options) {
  RPA_CHECK(shape.num_heads >= 1 && shape.num_heads <= kMlaMaxRows, ErrorKind::kShape,
            StrCat(NameEq("num_heads", shape.num_heads), " must be in [1, ", kMlaMaxRows, "]."),
            "num_heads counts the q heads on this device (DeepSeek-V3: 128, or 128 / tensor "
            "parallel size).");
  CheckHeadDim(shape.head_dim_ckv, "head_dim_ckv", 1024);
  CheckHeadDim(shape.head_dim_kpe, "head_dim_kpe", 256);
  RPA_CHECK(shape.page_size >= 1 && shape.page_size <= INT32_MAX, ErrorKind::kShape,
            StrCat(NameEq("page_size", shape.page_size), " must be positive (and fit in int32)."),
            "page_size is the tokens per page of the caches: their shape[1].");
  RPA_CHECK(shape.num_pages >= 0 && shape.num_pages <= INT32_MAX, ErrorKind::kShape,
            StrCat(NameEq("num_pages", shape.num_pages), " must be in [0, 2**31)."),
            "num_pages is the caches' shape[0].");
  CheckDtypeName(shape.q_dtype, "q_data_type", IsMlaQDtype(shape.q_dtype), kQDtypes);
  CheckDtypeName(shape.kv_dtype, "kv_data_type", IsMlaKvDtype(shape.kv_dtype), kKvDtypes);
  RPA_CHECK(std::isfinite(options.sm_scale), ErrorKind::kOption,
            StrCat(NameEq("sm_scale", options.sm_scale), " must be finite."),
            "DeepSeek's is (qk_nope_head_dim + qk_rope_head_dim) ** -0.5 = 192 ** -0.5 (times "
            "its YaRN mscale**2).");
  ProcessCpuBinding().Check();
  if (options.num_threads) {
    RPA_CHECK(*options.num_threads > 0, ErrorKind::kOption,
              StrCat(NameEq("num_threads", *options.num_threads), " must be positive."),
              "Pass None to use RPA_NUM_THREADS or every core, or a thread count >= 1.");
  }
  MlaProblem p;
  p.num_heads = shape.num_heads;
  p.dim_ckv = shape.head_dim_ckv;
  p.dim_kpe = shape.head_dim_kpe;
  p.page_size = shape.page_size;
  p.num_pages = shape.num_pages;
  p.q_dtype = shape.q_dtype;
  p.kv_dtype = shape.kv_dtype;
  p.causal = options.causal;
  p.sm_scale = static_cast<float>(options.sm_scale);
  p.num_threads = ResolveNumThreads(options.num_threads.value_or(0));
  return p;
}

void CopyMlaPageTable(const MlaPageTable& table, MlaProblem& p, MlaMetadata& m) {
  CheckViews(table);
  const int64_t batch = table.qo_indptr.shape[0] - 1;
  CopyIndptr(table.qo_indptr, "qo_indptr", "query rows", m.cu_q_lens);
  CopyIndptr(table.kv_indptr, "kv_indptr", "pages", m.page_begin);
  const int64_t used_pages = m.page_begin[batch];
  RPA_CHECK(used_pages <= table.kv_indices.shape[0], ErrorKind::kMetadata,
            StrCat("kv_indptr[", batch, "]=", used_pages, " must be less or equal to ",
                   NameEq("kv_indices.shape[0]", table.kv_indices.shape[0]), "."),
            "kv_indptr[batch_size] counts the pages in use; kv_indices must hold them all.");
  const auto* lens = static_cast<const int32_t*>(table.kv_len_arr.data);
  m.kv_lens.assign(lens, lens + batch);
  for (int64_t i = 0; i < batch; ++i) CheckKvLen(p, m, i);
  // The pages each sequence reads, compacted: sequence i's from page_begin[i].
  const auto* indices = static_cast<const int32_t*>(table.kv_indices.data);
  m.page_indices.clear();
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t first = m.page_begin[i];
    const int64_t read = (m.kv_lens[i] + p.page_size - 1) / p.page_size;
    m.page_begin[i] = static_cast<int32_t>(m.page_indices.size());
    for (int64_t j = first; j < first + read; ++j) {
      const int32_t page = indices[j];
      RPA_CHECK(page >= 0 && page < p.num_pages, ErrorKind::kPageIndex,
                StrCat("kv_indices[", j, "]=", page, " must be in range [0, ",
                       NameEq("num_pages", p.num_pages), ") because sequence ", i,
                       " reads it (kv_len_arr[", i, "]=", m.kv_lens[i], ")."),
                "Point every page a sequence reads at a page of the cache.");
      m.page_indices.push_back(page);
    }
  }
  m.page_begin[batch] = static_cast<int32_t>(m.page_indices.size());
  p.num_seqs = static_cast<int32_t>(batch);
  p.num_tokens = m.cu_q_lens[batch];
  m.Bind(p);
}

void BindMlaRun(const MlaRunViews& v, const MlaRunExtras& extras, MlaProblem& p) {
  CheckQueryView(v.q_nope, "q_nope", p, p.dim_ckv, "head_dim_ckv");
  CheckQueryView(v.q_pe, "q_pe", p, p.dim_kpe, "head_dim_kpe");
  p.ckv = CheckCacheView(v.ckv_cache, "ckv_cache", p, p.dim_ckv, "head_dim_ckv");
  p.kpe = CheckCacheView(v.kpe_cache, "kpe_cache", p, p.dim_kpe, "head_dim_kpe");
  CheckQueryView(v.out, "out", p, p.dim_ckv, "head_dim_ckv");
  RPA_CHECK(std::isfinite(extras.kv_scale) && extras.kv_scale > 0, ErrorKind::kOption,
            StrCat(NameEq("kv_scale", extras.kv_scale), " must be positive and finite."),
            "kv_scale dequantizes the caches (value = code * kv_scale); 1.0 for bf16 caches.");
  p.q_nope = MlaRows{v.q_nope.data, v.q_nope.strides[0], v.q_nope.strides[1]};
  p.q_pe = MlaRows{v.q_pe.data, v.q_pe.strides[0], v.q_pe.strides[1]};
  p.out = v.out.data;
  p.out_token_stride = v.out.strides[0];
  p.out_head_stride = v.out.strides[1];
  p.kv_scale = static_cast<float>(extras.kv_scale);
  p.lse = nullptr;
  if (extras.lse) BindLse(*extras.lse, p);
}

}  // namespace rpa::internal
