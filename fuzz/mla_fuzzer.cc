// libFuzzer target: MLA (rpa::MlaPlan). A small random batch (heads, latent
// widths, page size, dtypes, cache form, causal, threads from the input),
// then the input rewrites entries of its page table (qo_indptr, kv_indptr,
// kv_indices, kv_len_arr) with the values a scheduler gets wrong, and may
// pass a bad kv_scale or lse. Plan + Run must either throw rpa::Error with
// out and lse bit-identical, or succeed and (where every key read is
// finite: the slots left over hold NaN) match the float64 reference of the
// rewritten, valid table; a plan must also survive the caller's metadata
// being overwritten before the run.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "rpa/error.h"
#include "rpa/mla.h"
#include "testing/mla_batch.h"

using namespace rpa::fuzz;  // NOLINT: a fuzzer's one file.

namespace {

constexpr rpa::DType kQDtypes[] = {rpa::DType::kF32, rpa::DType::kBF16, rpa::DType::kF16};
constexpr rpa::DType kKvDtypes[] = {rpa::DType::kF32, rpa::DType::kBF16, rpa::DType::kF16,
                                    rpa::DType::kF8E4M3FN};

rpa::testing::MlaBatchSpec SpecOf(Input& in) {
  rpa::testing::MlaBatchSpec spec;
  spec.num_heads = in.Small(1, 20);
  spec.head_dim_ckv = 16 * in.Small(1, 4);
  spec.head_dim_kpe = 16 * in.Small(1, 2);
  spec.page_size = in.Small(1, 9);
  spec.q_dtype = kQDtypes[in.Byte() % 3];
  spec.kv_dtype = kKvDtypes[in.Byte() % 4];
  spec.combined_cache = in.Byte() % 2 == 1;
  spec.spare_pages = in.Small(0, 2);
  const int64_t seqs = in.Small(0, 4);
  for (int64_t i = 0; i < seqs; ++i) {
    rpa::testing::MlaSequence s;
    s.kv_len = in.Small(0, 150);
    s.q_len = std::min<int64_t>(s.kv_len, in.Small(0, 3));
    spec.sequences.push_back(s);
  }
  spec.seed = in.U32();
  return spec;
}

// Rewrites up to 3 entries of the page table's arrays.
void EditTable(Input& in, rpa::testing::MlaBatch& b) {
  std::vector<int32_t>* arrays[] = {&b.qo_indptr, &b.kv_indptr, &b.kv_indices, &b.kv_len_arr};
  const int edits = in.Small(0, 3);
  for (int e = 0; e < edits; ++e) {
    std::vector<int32_t>& a = *arrays[in.Byte() % 4];
    if (a.empty()) continue;
    a[in.Byte() % a.size()] = in.Meta(0, static_cast<int64_t>(b.num_pages) * 2);
  }
}

// Whether every key a sequence of the (valid) table reads is finite: where
// one is not, a causal row that does not see it may still be NaN
// (docs/mla.md, Precision), so only the absence of crashes is checked.
bool ReadKeysFinite(const rpa::testing::MlaBatch& b) {
  const rpa::TensorView views[] = {b.CkvCache(), b.KpeCache()};
  for (size_t i = 0; i < b.kv_len_arr.size(); ++i) {
    for (int64_t t = 0; t < b.kv_len_arr[i]; ++t) {
      const int64_t page = b.kv_indices[b.kv_indptr[i] + t / b.spec.page_size];
      for (const rpa::TensorView& v : views) {
        for (int64_t d = 0; d < v.shape[2]; ++d) {
          const float x = rpa::LoadAsF32(
              v.dtype, v.data, page * v.strides[0] + (t % b.spec.page_size) * v.strides[1] + d);
          if (!std::isfinite(x)) return false;
        }
      }
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  rpa::testing::MlaBatch b = rpa::testing::MakeMlaBatch(SpecOf(in));
  EditTable(in, b);
  const bool causal = in.Byte() % 2 == 1;
  rpa::MlaOptions options;
  options.causal = causal;
  options.sm_scale = 1.0 / std::sqrt(static_cast<double>(b.spec.head_dim_ckv + b.spec.head_dim_kpe));
  options.num_threads = in.Small(1, 3);
  rpa::MlaRunExtras extras;
  extras.kv_scale = in.Byte() < 16 ? -1.0 : 0.5 + in.Unit();
  std::vector<float> lse(static_cast<size_t>(std::max<int64_t>(b.num_tokens, 0) * b.spec.num_heads + 1), 7.0f);
  const int64_t lse_heads = in.Byte() < 16 ? b.spec.num_heads + 1 : b.spec.num_heads;
  extras.lse = rpa::MutableTensorView(lse.data(), rpa::DType::kF32,
                                      {std::max<int64_t>(b.num_tokens, 0), lse_heads});
  std::vector<uint8_t> out = b.NewOutput();
  const std::vector<uint8_t> out_before = out;
  const std::vector<float> lse_before = lse;
  rpa::MlaPlan plan;
  try {
    {
      rpa::testing::MlaBatch copy = b;  // The caller's arrays, overwritten after Plan.
      plan.Plan(copy.Shape(), copy.PageTable(), options);
      for (std::vector<int32_t>* a : {&copy.qo_indptr, &copy.kv_indptr, &copy.kv_indices,
                                      &copy.kv_len_arr}) {
        for (int32_t& v : *a) v = -12345;
      }
    }
    plan.Run(b.QNope(), b.QPe(), b.CkvCache(), b.KpeCache(), b.OutView(out), extras);
  } catch (const rpa::Error&) {
    if (out != out_before || lse != lse_before) Fail("a rejected MLA call wrote its outputs");
    return 0;
  }
  if (!ReadKeysFinite(b)) return 0;
  const rpa::testing::MlaReferenceResult want =
      rpa::testing::MlaReference(b, causal, options.sm_scale, extras.kv_scale);
  const double abs_tol = KvTolerance(b.spec.kv_dtype);
  const double rel_tol = RelTolerance(b.spec.q_dtype, b.spec.kv_dtype);
  for (size_t i = 0; i < want.out.size(); ++i) {
    const double got = rpa::LoadAsF32(b.spec.q_dtype, out.data(), static_cast<int64_t>(i));
    if (!Close(got, want.out[i], abs_tol, rel_tol)) {
      Fail("MLA out[" + std::to_string(i) + "] = " + std::to_string(got) + ", reference " +
           std::to_string(want.out[i]));
    }
  }
  for (size_t i = 0; i < want.lse.size(); ++i) {
    if (!Close(lse[i], want.lse[i], 1e-3, 1e-4)) {
      Fail("MLA lse[" + std::to_string(i) + "] = " + std::to_string(lse[i]) + ", reference " +
           std::to_string(want.lse[i]));
    }
  }
  return 0;
}
