// The MLA task loop and the portable f32 kernel (mla_highway_f32), compiled
// once per Highway target (the set capped by RPA_HWY_TARGETS) and
// dispatched to the best one the CPU has.
//
// Task loop, per task (rows across lanes, mla_kernel.h):
//   qt[d][r] = q_r[d] (q_nope then q_pe), f32; m = -inf, l = 0, acc = 0
//   per KV tile of n <= 128 keys t0..t0+n-1 (rows read in place in their pages):
//     st[i][r] = q_r . k_i                             (kernel logits)
//     x = st * sm_scale * kv_scale; causal: x = -inf for t0 + i > pos_r
//     m' = max(m, max_i x); alpha = e^(m - m'); P = e^(x - m')
//     l = alpha l + sum_i P; acc *= alpha; acc += V^T P  (kernel pv)
//   out_r = acc_r * kv_scale / l_r, lse_r = m_r + log l_r (FinishRow), or
//   the partial (m, l, acc) of a split task for the merge.
// A row that meets a logit that is not finite (a NaN or infinite element of
// q or of a key it sees, or an f32 overflow) is NaN, with LSE NaN.
//
// Kernel mla_highway_f32: every cache row converted to f32 exactly once per
// tile (fp8 e4m3fn as value * 2^-8, undone in the scales), then both
// products as broadcast-FMA blocks: logits broadcast one element of a key
// against a vector of rows' q, PV one row's weight against a vector of dims.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "mla/mla_highway.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "hwy/highway.h"
#include "kernel/exp_non_positive-inl.h"
#include "kernel/highway_load-inl.h"
#include "kernel/highway_outer_product-inl.h"
#include "kernel/softmax_finish.h"
#include "kernel/tile_kernel.h"
#include "mla/mla_kernel.h"

HWY_BEFORE_NAMESPACE();
namespace rpa::internal {
namespace HWY_NAMESPACE {
namespace mla {

// ---- The f32 kernel.

// Accumulators per block: half the vector registers of the target.
constexpr int kAccs = HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4 ||
                              HWY_TARGET == HWY_SSSE3 || HWY_TARGET == HWY_EMU128
                          ? 8
                          : 16;

// The whole product: a_count rows of out, `vectors` vectors each.
template <int kB>
HWY_INLINE void F32BlocksOf(const OuterProduct& g, int64_t a_count, int64_t b0) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(DF()));
  ForEachMlaBlock<kAccs / kB>(a_count, [&]<int kA>(int64_t a0) HWY_ATTR {
    OuterProductBlock<kA, kB>(g, {a0, b0 * lanes, kB * lanes});
  });
}

HWY_NOINLINE void F32Product(const OuterProduct& g, int64_t a_count, int64_t width) {
  const int64_t vectors = width / static_cast<int64_t>(hn::Lanes(DF()));
  int64_t b = 0;
  for (; b + 2 <= vectors; b += 2) F32BlocksOf<2>(g, a_count, b);
  if (b < vectors) F32BlocksOf<1>(g, a_count, b);
}

void F32PrepareQ(const MlaKernelArgs& /*args*/) {}  // The products read scratch->qt.

// Cache rows to f32 rows [n][dim_ckv + dim_kpe] in the tile scratch.
MlaTile F32PrepareTile(const MlaKernelArgs& args, const MlaTile& rows) {
  const int64_t dim_qk = args.dim_ckv + args.dim_kpe;
  float* tile = static_cast<float*>(args.scratch->tile);
  for (int64_t i = 0; i < rows.n; ++i) {
    float* row = tile + i * dim_qk;
    LoadRowF32(rows.dtype, rows.ckv[i], args.dim_ckv, args.dim_ckv, row);
    LoadRowF32(rows.dtype, rows.kpe[i], args.dim_kpe, args.dim_kpe, row + args.dim_ckv);
  }
  MlaTile converted = rows;
  converted.dtype = DType::kF32;  // Rows at tile + i * dim_qk: the products index them so.
  return converted;
}

void F32Logits(const MlaKernelArgs& args, const MlaTile& tile) {
  const MlaScratch& s = *args.scratch;
  const int64_t dim_qk = args.dim_ckv + args.dim_kpe;
  const OuterProduct g{static_cast<const float*>(s.tile), dim_qk, 1, s.qt, args.rows_pad, dim_qk,
                  s.st, args.rows_pad, false};
  F32Product(g, tile.n, args.rows_pad);
}

void F32Pv(const MlaKernelArgs& args, const MlaTile& tile) {
  const MlaScratch& s = *args.scratch;
  const int64_t dim_qk = args.dim_ckv + args.dim_kpe;
  const OuterProduct g{s.st, 1, args.rows_pad, static_cast<const float*>(s.tile), dim_qk, tile.n,
                  s.acc, args.dim_ckv, true};
  F32Product(g, args.rows, args.dim_ckv);
}

const MlaKernel kF32Kernel = {"mla_highway_f32", /*e4m3_scaled=*/true,
                              NextTilePrefetch::kUpFront, F32PrepareQ,
                              F32PrepareTile, F32Logits, F32Pv};

// ---- The task loop.

struct TaskShape {
  int64_t rows = 0;      // Query tokens of the task x heads.
  int64_t rows_pad = 0;  // RoundUp(rows, 16).
  int64_t q_start = 0;   // The sequence's first row of q.
  int64_t first_pos = 0; // The task's first query position (causal).
  int64_t kv_len = 0;
};

TaskShape ShapeOf(const MlaProblem& p, const MlaTask& task) {
  TaskShape t;
  t.rows = (task.q_end - task.q_begin) * p.num_heads;
  t.rows_pad = MlaRoundUp(t.rows, 16);
  t.q_start = p.cu_q_lens[task.seq];
  const int64_t q_len = p.cu_q_lens[task.seq + 1] - t.q_start;
  t.kv_len = p.kv_lens[task.seq];
  t.first_pos = t.kv_len - q_len + task.q_begin;
  return t;
}

// qt, the positions and the softmax state of the task's rows; padding rows
// are zero queries that see every key (finite, never written out).
void LoadQueries(const MlaProblem& p, const MlaTask& task, const TaskShape& t,
                 const MlaScratch& s) {
  const int64_t dim_qk = p.DimQk();
  float row[1024 + 256];
  for (int64_t r = 0; r < t.rows_pad; ++r) {
    const bool real = r < t.rows;
    const int64_t token = t.q_start + task.q_begin + r / p.num_heads;
    const int64_t head = r % p.num_heads;
    if (real) {
      LoadRowF32(p.q_dtype,
                 ElementPtr(p.q_nope.data, p.q_dtype,
                            token * p.q_nope.token_stride + head * p.q_nope.head_stride),
                 p.dim_ckv, p.dim_ckv, row);
      LoadRowF32(p.q_dtype,
                 ElementPtr(p.q_pe.data, p.q_dtype,
                            token * p.q_pe.token_stride + head * p.q_pe.head_stride),
                 p.dim_kpe, p.dim_kpe, row + p.dim_ckv);
    }
    for (int64_t d = 0; d < dim_qk; ++d) s.qt[d * t.rows_pad + r] = real ? row[d] : 0.0f;
    s.pos[r] = real && p.causal ? static_cast<int32_t>(t.first_pos + r / p.num_heads)
                                : std::numeric_limits<int32_t>::max();
    s.m[r] = -std::numeric_limits<float>::infinity();
    s.l[r] = 0.0f;
  }
  std::memset(s.acc, 0, sizeof(float) * static_cast<size_t>(p.dim_ckv * t.rows));
}

// The tile's cache rows, page by page (one division per tile, not per key).
void TileRows(const MlaProblem& p, const MlaTask& task, int64_t t0, int64_t n,
              const MlaScratch& s) {
  const int64_t elem = static_cast<int64_t>(SizeOf(p.kv_dtype));
  const int32_t* pages = p.page_indices + p.page_begin[task.seq];
  int64_t column = t0 / p.page_size;
  int64_t slot = t0 % p.page_size;
  for (int64_t i = 0; i < n;) {
    const int64_t page = pages[column];
    const int64_t count = std::min(n - i, p.page_size - slot);
    for (int64_t j = 0; j < count; ++j) {
      s.ckv_rows[i + j] = static_cast<const uint8_t*>(p.ckv.data) +
                          (page * p.ckv.page_stride + (slot + j) * p.ckv.slot_stride) * elem;
      s.kpe_rows[i + j] = static_cast<const uint8_t*>(p.kpe.data) +
                          (page * p.kpe.page_stride + (slot + j) * p.kpe.slot_stride) * elem;
    }
    i += count;
    slot = 0;
    ++column;
  }
}

// Prefetches keys [t0, t0 + n) of the task into L2 while the tile before
// them computes, where the kernel asks for it (MlaKernel::next_tile): the
// logits are their first reader, one row per key.
void PrefetchTile(const MlaProblem& p, const MlaTask& task, int64_t t0, int64_t n) {
  const int64_t elem = static_cast<int64_t>(SizeOf(p.kv_dtype));
  const int32_t* pages = p.page_indices + p.page_begin[task.seq];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t page = pages[(t0 + i) / p.page_size];
    const int64_t slot = (t0 + i) % p.page_size;
    PrefetchRow(static_cast<const uint8_t*>(p.ckv.data) +
                    (page * p.ckv.page_stride + slot * p.ckv.slot_stride) * elem,
                p.dim_ckv * elem);
    PrefetchRow(static_cast<const uint8_t*>(p.kpe.data) +
                    (page * p.kpe.page_stride + slot * p.kpe.slot_stride) * elem,
                p.dim_kpe * elem);
  }
}

// The online softmax of one tile over every row, st's logits becoming
// weights in place; alpha gets each row's rescale. Returns whether any
// alpha is not 1.
bool SoftmaxTile(const MlaScratch& s, int64_t rows_pad, int64_t t0, int64_t n, float scale,
                 bool masked_keys) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const VF neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
  const VF nan = hn::Set(df, std::numeric_limits<float>::quiet_NaN());
  const VF vscale = hn::Set(df, scale);
  bool rescale = false;
  for (int64_t b = 0; b < rows_pad; b += lanes) {
    const VF m_old = hn::LoadU(df, s.m + b);
    const auto pos = hn::LoadU(di, s.pos + b);
    auto bad = hn::IsNaN(m_old);
    VF vmax = neg_inf;
    for (int64_t i = 0; i < n; ++i) {
      float* x_at = s.st + i * rows_pad + b;
      VF x = hn::Mul(hn::LoadU(df, x_at), vscale);
      if (masked_keys) {
        const auto masked =
            hn::RebindMask(df, hn::Gt(hn::Set(di, static_cast<int32_t>(t0 + i)), pos));
        bad = hn::Or(bad, hn::AndNot(masked, hn::Not(hn::IsFinite(x))));
        x = hn::IfThenElse(masked, neg_inf, x);
      } else {
        bad = hn::Or(bad, hn::Not(hn::IsFinite(x)));
      }
      hn::StoreU(x, df, x_at);
      vmax = hn::Max(vmax, x);
    }
    const VF m_new = hn::Max(m_old, vmax);
    // No key seen yet (every one masked): weights 0, state unchanged.
    const auto none = hn::Or(bad, hn::Eq(m_new, neg_inf));
    VF sum = hn::Zero(df);
    for (int64_t i = 0; i < n; ++i) {
      float* x_at = s.st + i * rows_pad + b;
      const VF w =
          hn::IfThenZeroElse(none, ExpNonPositive(df, hn::Sub(hn::LoadU(df, x_at), m_new)));
      sum = hn::Add(sum, w);
      hn::StoreU(w, df, x_at);
    }
    const VF alpha = hn::IfThenElse(hn::Or(none, hn::Eq(m_old, neg_inf)),
                                    hn::IfThenElseZero(hn::Not(bad), hn::Set(df, 1.0f)),
                                    ExpNonPositive(df, hn::Sub(m_old, m_new)));
    const VF l_old = hn::LoadU(df, s.l + b);
    hn::StoreU(hn::IfThenElse(bad, nan, hn::IfThenElse(none, m_old, m_new)), df, s.m + b);
    hn::StoreU(hn::IfThenElse(bad, nan, hn::MulAdd(l_old, alpha, sum)), df, s.l + b);
    hn::StoreU(alpha, df, s.alpha + b);
    rescale = rescale || !hn::AllTrue(df, hn::Eq(alpha, hn::Set(df, 1.0f)));
  }
  return rescale;
}

// acc[r] *= alpha[r] (rows whose alpha is not 1).
void RescaleAcc(const MlaScratch& s, int64_t rows, int64_t dim_ckv) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r = 0; r < rows; ++r) {
    if (s.alpha[r] == 1.0f) continue;
    const VF alpha = hn::Set(df, s.alpha[r]);
    float* acc = s.acc + r * dim_ckv;
    for (int64_t d = 0; d < dim_ckv; d += lanes) {
      hn::StoreU(hn::Mul(hn::LoadU(df, acc + d), alpha), df, acc + d);
    }
  }
}

// The task's rows out: finished into out and lse, or as a partial.
void FinishTask(const MlaProblem& p, const MlaTask& task, const TaskShape& t,
                const MlaScratch& s, float out_unit, float* partials) {
  float row[1024];
  const int64_t elem = static_cast<int64_t>(SizeOf(p.q_dtype));
  for (int64_t r = 0; r < t.rows; ++r) {
    if (task.partial_offset >= 0) {
      float* part = partials + task.partial_offset;
      part[r] = s.m[r];
      part[t.rows + r] = s.l[r];
      std::memcpy(part + 2 * t.rows + r * p.dim_ckv, s.acc + r * p.dim_ckv,
                  sizeof(float) * static_cast<size_t>(p.dim_ckv));
      continue;
    }
    const int64_t token = t.q_start + task.q_begin + r / p.num_heads;
    const int64_t head = r % p.num_heads;
    const FinishedRow f = FinishRow(s.m[r], s.l[r], nullptr, out_unit);
    if (p.lse != nullptr) p.lse[token * p.lse_stride + head] = f.lse;
    const float* acc = s.acc + r * p.dim_ckv;
    for (int64_t d = 0; d < p.dim_ckv; ++d) row[d] = acc[d] * f.out_scale;
    StoreRow(p.q_dtype,
             static_cast<uint8_t*>(p.out) +
                 (token * p.out_token_stride + head * p.out_head_stride) * elem,
             row, p.dim_ckv);
  }
}

void RunTask(const MlaProblem& p, const MlaTask& task, const MlaKernel& kernel,
             const MlaScratch& s, float* partials) {
  const TaskShape t = ShapeOf(p, task);
  LoadQueries(p, task, t, s);
  const MlaKernelArgs args{&s, t.rows, t.rows_pad, p.dim_ckv, p.dim_kpe};
  kernel.prepare_q(args);
  const float unit = MlaValueUnit(p, kernel);
  for (int64_t t0 = task.kv_begin; t0 < task.kv_end; t0 += kMlaTileKeys) {
    const int64_t n = std::min<int64_t>(kMlaTileKeys, task.kv_end - t0);
    TileRows(p, task, t0, n, s);
    if (kernel.next_tile == NextTilePrefetch::kUpFront) {
      PrefetchTile(p, task, t0 + n, std::min<int64_t>(kMlaTileKeys, task.kv_end - t0 - n));
    }
    const MlaTile tile = kernel.prepare_tile(args, MlaTile{p.kv_dtype, n, s.ckv_rows, s.kpe_rows});
    kernel.logits(args, tile);
    const bool masked_keys = p.causal && t0 + n - 1 > t.first_pos;
    if (SoftmaxTile(s, t.rows_pad, t0, n, p.sm_scale * unit, masked_keys)) {
      RescaleAcc(s, t.rows, p.dim_ckv);
    }
    kernel.pv(args, tile);
  }
  FinishTask(p, task, t, s, unit, partials);
}

}  // namespace mla

void MlaRunTask(const MlaProblem& p, const MlaTask& task, const MlaKernel& kernel,
                const MlaScratch& s, float* partials) {
  mla::RunTask(p, task, kernel, s, partials);
}

const MlaKernel* MlaF32Kernel() { return &mla::kF32Kernel; }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace rpa::internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rpa::internal {

HWY_EXPORT(MlaRunTask);
HWY_EXPORT(MlaF32Kernel);

void RunMlaTask(const MlaProblem& problem, const MlaTask& task, const MlaKernel& kernel,
                const MlaScratch& scratch, float* partials) {
  HWY_DYNAMIC_DISPATCH(MlaRunTask)(problem, task, kernel, scratch, partials);
}

const MlaKernel& MlaHighwayKernel() { return *HWY_DYNAMIC_DISPATCH(MlaF32Kernel)(); }

}  // namespace rpa::internal
#endif  // HWY_ONCE
