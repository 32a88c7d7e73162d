#include "rpa/merge.h"

#include <algorithm>
#include <cmath>

#include "format.h"
#include "validate/validate_internal.h"

namespace rpa {
namespace {

using ::rpa::ErrorKind;
using internal::PyRepr;
using internal::StrCat;

// `t` has the shape and dtype of `model` (out_a or lse_a, checked before),
// and the layout every view must have.
void CheckLike(const TensorView& t, std::string_view name, const TensorView& model,
               std::string_view model_name) {
  RPA_CHECK(t.rank == model.rank && t.shape == model.shape, ErrorKind::kShape,
            StrCat(name, ".shape=", t.ShapeString(), " must be the same as ", model_name,
                   ".shape=", model.ShapeString(), "."),
            "Merge states of the same rows and heads.");
  RPA_CHECK(t.dtype == model.dtype, ErrorKind::kDtype,
            StrCat(name, ".dtype=", PyRepr(t.dtype), " must be the same as ", model_name,
                   ".dtype=", PyRepr(model.dtype), "."),
            "Merge states of one dtype.");
  internal::CheckInnermostContiguous(t, name);  // Aligned too: read and written as typed.
}

}  // namespace

void MergeStates(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                 const TensorView& lse_b, const MutableTensorView& out,
                 const MutableTensorView& lse, LseBase base) {
  // out_a and lse_a are checked as views of their own; the other four like them.
  RPA_CHECK(out_a.rank == 3, ErrorKind::kShape,
            StrCat("out_a.shape=", out_a.ShapeString(),
                   " must have 3 dimensions [num_tokens, num_heads, head_dim]."),
            "Pass attention outputs as [num_tokens, num_heads, head_dim].");
  internal::CheckNonNegativeExtents(out_a, "out_a");
  RPA_CHECK(out_a.dtype == DType::kF32 || out_a.dtype == DType::kBF16 || out_a.dtype == DType::kF16,
            ErrorKind::kDtype,
            StrCat("out_a.dtype=", PyRepr(out_a.dtype),
                   " is not supported; out_a must be one of float32, bfloat16, float16."),
            "Cast the outputs to one of these dtypes.");
  RPA_CHECK(lse_a.rank == 2 && lse_a.shape[0] == out_a.shape[0] && lse_a.shape[1] == out_a.shape[1],
            ErrorKind::kShape,
            StrCat("lse_a.shape=", lse_a.ShapeString(), " must be (", out_a.shape[0], ", ",
                   out_a.shape[1], ") = out_a.shape[:2]."),
            "Pass one log-sum-exp per row and head.");
  RPA_CHECK(lse_a.dtype == DType::kF32, ErrorKind::kDtype,
            StrCat("lse_a.dtype=", PyRepr(lse_a.dtype), " must be float32."),
            "Pass log-sum-exps as float32.");
  internal::CheckInnermostContiguous(out_a, "out_a");
  internal::CheckInnermostContiguous(lse_a, "lse_a");
  CheckLike(out_b, "out_b", out_a, "out_a");
  CheckLike(lse_b, "lse_b", lse_a, "lse_a");
  CheckLike(out, "out", out_a, "out_a");
  CheckLike(lse, "lse", lse_a, "lse_a");

  const int64_t tokens = out_a.shape[0];
  const int64_t heads = out_a.shape[1];
  const int64_t head_dim = out_a.shape[2];
  auto lse_at = [](const TensorView& t, int64_t i, int64_t h) {
    return static_cast<const float*>(t.data)[i * t.strides[0] + h * t.strides[1]];
  };
  for (int64_t i = 0; i < tokens; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      const float la = lse_at(lse_a, i, h);
      const float lb = lse_at(lse_b, i, h);
      const float shift = std::max(la, lb);
      // Both sides empty: no key anywhere.
      const bool empty = shift == -INFINITY;
      const bool two = base == LseBase::k2;
      const float wa = empty ? 0.0f : two ? std::exp2(la - shift) : std::exp(la - shift);
      const float wb = empty ? 0.0f : two ? std::exp2(lb - shift) : std::exp(lb - shift);
      const float total = wa + wb;
      const int64_t a_base = i * out_a.strides[0] + h * out_a.strides[1];
      const int64_t b_base = i * out_b.strides[0] + h * out_b.strides[1];
      const int64_t o_base = i * out.strides[0] + h * out.strides[1];
      for (int64_t d = 0; d < head_dim; ++d) {
        const float merged =
            empty ? 0.0f
                  : (wa * LoadAsF32(out_a.dtype, out_a.data, a_base + d) +
                     wb * LoadAsF32(out_b.dtype, out_b.data, b_base + d)) /
                        total;
        StoreFromF32(out.dtype, out.data, o_base + d, merged);
      }
      static_cast<float*>(lse.data)[i * lse.strides[0] + h * lse.strides[1]] =
          empty ? -INFINITY : shift + (two ? std::log2(total) : std::log(total));
    }
  }
}

}  // namespace rpa
