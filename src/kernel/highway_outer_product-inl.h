// The register-blocked f32 product every portable Highway kernel that
// converts its tile first runs: highway_packed's logits and PV, and
// mla_highway_f32's. Each block keeps kA rows x kB vectors of the output in
// registers; per step k it loads kB vectors of y_k and broadcasts one x_a[k]
// per row: no horizontal sums, no conversion in the loop.
//
// Sizeless vectors (Highway's SVE targets) cannot form an array, so the
// block's accumulators are not one: each row's kB accumulators are the
// locals of one level of a recursion over the rows, and the innermost level
// runs the k loop through a chain of inlined per-row steps. On fixed-size
// targets this compiles to what an array of accumulators compiles to.
//
// Compiled once per Highway target: include it only through
// hwy/foreach_target.h.
#if defined(RPA_SRC_KERNEL_HIGHWAY_OUTER_PRODUCT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RPA_SRC_KERNEL_HIGHWAY_OUTER_PRODUCT_INL_H_
#undef RPA_SRC_KERNEL_HIGHWAY_OUTER_PRODUCT_INL_H_
#else
#define RPA_SRC_KERNEL_HIGHWAY_OUTER_PRODUCT_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include "hwy/highway.h"
#include "kernel/highway_load-inl.h"

HWY_BEFORE_NAMESPACE();
namespace rpa::internal {
namespace HWY_NAMESPACE {

// out[a][j] (+)= sum_k x_a[k] * y_k[j] for k < k_count: x_a[k] at
// x + a * x_a_step + k * x_k_step, y_k[j] at y + k * y_k_step + j, out[a][j]
// at out + a * out_a_step + j; accumulate: add to out, else overwrite it.
struct OuterProduct {
  const float* x;
  int64_t x_a_step, x_k_step;
  const float* y;
  int64_t y_k_step;
  int64_t k_count;
  float* out;
  int64_t out_a_step;
  bool accumulate;
};

// Which block: rows [a0, a0 + kA), columns [j0, j0 + columns), columns
// <= kB * Lanes (fewer only in a last, partial block of columns, which
// overwrites: an accumulating product has whole blocks).
struct OuterProductBlockAt {
  int64_t a0, j0, columns;
};

namespace outer_product {

// Stores a row's accumulators c0, c1 (which started from out when the
// product accumulates) to its `columns` columns at out; a partial block
// stores only those: the next row may follow them.
template <int kB>
HWY_INLINE void StoreRow(VF c0, VF c1, int64_t columns, float* out) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  if (columns == kB * lanes) {
    hn::StoreU(c0, df, out);
    if constexpr (kB == 2) hn::StoreU(c1, df, out + lanes);
    return;
  }
  hn::BlendedStore(c0, hn::FirstN(df, static_cast<size_t>(std::min(columns, lanes))), df, out);
  if (kB == 2 && columns > lanes) {
    hn::BlendedStore(c1, hn::FirstN(df, static_cast<size_t>(columns - lanes)), df, out + lanes);
  }
}

// Level `a` of the block: declares row a's accumulators, recurses with a
// step that also updates them, then stores them. `steps(k, y0, y1)` applies
// step k to rows [0, a). Level kA runs the k loop.
template <int kA, int kB, int a, class Steps>
HWY_INLINE void Rows(const OuterProduct& g, const OuterProductBlockAt& at, const Steps& steps) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  if constexpr (a == kA) {
    const float* y = g.y + at.j0;
    for (int64_t k = 0; k < g.k_count; ++k) {
      const VF y0 = hn::LoadU(df, y + k * g.y_k_step);
      const VF y1 = kB == 2 ? hn::LoadU(df, y + k * g.y_k_step + lanes) : y0;
      steps(k, y0, y1);
    }
  } else {
    const float* x = g.x + (at.a0 + a) * g.x_a_step;
    float* out = g.out + (at.a0 + a) * g.out_a_step + at.j0;
    VF c0 = g.accumulate ? hn::LoadU(df, out) : hn::Zero(df);
    VF c1 = kB == 2 && g.accumulate ? hn::LoadU(df, out + lanes) : hn::Zero(df);
    auto step = [&](int64_t k, VF y0, VF y1) HWY_ATTR __attribute__((always_inline)) {
      steps(k, y0, y1);
      const VF xv = hn::Set(df, x[k * g.x_k_step]);
      c0 = hn::MulAdd(xv, y0, c0);
      if constexpr (kB == 2) c1 = hn::MulAdd(xv, y1, c1);
    };
    Rows<kA, kB, a + 1>(g, at, step);
    StoreRow<kB>(c0, c1, at.columns, out);
  }
}

}  // namespace outer_product

// One block of kA rows x kB (1 or 2) vectors of columns.
template <int kA, int kB>
HWY_INLINE void OuterProductBlock(const OuterProduct& g, const OuterProductBlockAt& at) {
  static_assert(kA >= 1 && (kB == 1 || kB == 2));
  outer_product::Rows<kA, kB, 0>(g, at, [](int64_t, VF, VF) HWY_ATTR {});
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace rpa::internal
HWY_AFTER_NAMESPACE();

#endif  // RPA_SRC_KERNEL_HIGHWAY_OUTER_PRODUCT_INL_H_
