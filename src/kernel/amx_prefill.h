// The AMX prefill kernel: both products of a prefill task on Intel AMX
// tiles, bf16 in, f32 accumulation (amx.h has the products, bf16_pairs.h the
// packs).
//
// Arithmetic: per KV tile, K is packed once into the VNNI pair layout
// ([RoundUp(head_dim, 32) / 2][RoundUp(n, 32)][2] bf16; fp8 and int8
// converted exactly, e4m3fn at its true value), V in pairs of keys
// ([RoundUp(n, 32) / 2][RoundUp(head_dim, 16)][2]), and every 16-row block
// of q [rows, dim_pad] bf16 multiplies K: S = Q K^T in f32 (tdpbf16ps).
// The softmax (AVX-512) turns S into weights rounded to bf16, as flash
// attention does on GPUs: where the tile allows, fused (Weights: S stored
// in TileScratch::logits, then lazy_softmax_bf16.h's lazy softmax straight
// to bf16), elsewhere the task loop's f32 softmax, its weights rounded in
// place. Then acc += P V in f32 over the keys the rows need. The error over
// the f32 path is the weights' bf16 rounding (2^-9 relative each; the LSE
// sums the unrounded weights; the fused exp adds ~1e-6) and q's for
// non-bf16 q (dispatch gives this kernel bf16 q only).
//
// Shapes: tiles always have 16 rows, so a kv head's rows run to a multiple
// of 16 from their first (kRowAlign; in a task over several kv heads the
// scratch is padded for the last head's, ScratchRows in scratch.cc): the
// logits' extra rows land in the next head's rows (computed again when its
// turn comes) or in padding; PV keeps them off acc (Pv below). K and V are
// packed once per tile, side by side in TileScratch::packed (prepare_tile,
// bf16_pairs.h), and the task loop runs the rows in chunks of kRowChunk, so
// a chunk's logits stay in L1 between the products and the softmax; the
// unfused softmax's bf16 weights overwrite their own f32 logits row by row.
//
// Dispatch chooses it for the middle and prefill classes (> kDecodeMaxRows
// rows per kv head) with bf16 q where the CPU has AMX (unless RPA_AMX=0),
// and its twin on the scalar tile model
// (testing/amx_emulation.h) under a test's ScopedAmxEmulation. x86-64 only.
#ifndef RPA_SRC_KERNEL_AMX_PREFILL_H_
#define RPA_SRC_KERNEL_AMX_PREFILL_H_

#include <cstring>

#include "kernel/tile_kernel.h"

#if defined(__x86_64__)
#include "kernel/amx.h"
#include "kernel/avx512_common.h"
#include "kernel/bf16_pairs.h"
#include "kernel/lazy_softmax_bf16.h"
#include "rpa/dtype.h"

namespace rpa::internal {

// Products on the hardware's AMX bf16 tiles for bf16 q over K/V of kv_dtype
// (bf16, fp8 or int8; null for any other); q in kBf16, accumulators
// kNatural. Needs CpuFeatures::amx_bf16.
const ProductKernel* AmxPrefill(DType kv_dtype);

// The same kernel over another tile unit's products: Unit has static
// Logits(const AmxLogitsArgs&) and PvBf16(const AmxPvBf16Args&) as amx.h's,
// and kName, the kernel's name. AmxPrefill's unit is the hardware; the
// scalar tile model's twin is testing/amx_emulation.cc's.
template <class Unit>
const ProductKernel* AmxPrefillOn(DType kv_dtype);

namespace amx_prefill {

// The tile products S = Q K^T of q's rows over the tile's packed K
// (prepare_tile's) into s [RoundUp(q.rows, 16)][s_stride].
inline AmxLogitsArgs LogitsArgs(const QueryRows& q, const KvTile& tile,
                                const TileScratch& scratch, float* s, int64_t s_stride) {
  return {static_cast<const uint16_t*>(q.data), q.stride, q.rows, PackedTileKeys(scratch), tile.n,
          tile.head_dim, s, s_stride};
}

template <class Unit>
void Logits(const QueryRows& q, const KvTile& tile, const TileLogits& s,
            const TileScratch& scratch) {
  if (q.rows <= 0 || tile.n <= 0) return;
  Unit::Logits(LogitsArgs(q, tile, scratch, s.s, s.stride));
}

// AMX's logits of a row chunk as stored in TileScratch::logits ([rows][n32]
// f32), read back 32 keys at a time: lazy_softmax's Source.
struct StoredLogits {
  const float* s;
  int64_t stride;
  int64_t n;
  template <int kRows>
  RPA_AVX512_BF16_TARGET __attribute__((always_inline)) void Dots(int64_t r, int64_t j0,
                                                                  __m512* t0, __m512* t1) const {
    const __mmask16 low = avx512::Lanes16(n - j0), high = avx512::Lanes16(n - j0 - 16);
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
      const float* row = s + (r + i) * stride + j0;
      t0[i] = _mm512_maskz_loadu_ps(low, row);
      t1[i] = _mm512_maskz_loadu_ps(high, row + 16);
    }
  }
};

// ProductKernel::weights: the chunk's logits on the tiles into
// TileScratch::logits (in L1: 32 rows x 256 keys are 32 KiB; at most
// kRowChunk rows fit), then the lazy softmax (lazy_softmax_bf16.h) from
// there to bf16 weights at s.s.
template <class Unit>
RPA_AVX512_BF16_TARGET bool Weights(const QueryRows& q, const KvTile& tile, const TileLogits& s,
                                    float logit_scale, const SoftmaxState& state,
                                    const TileScratch& scratch) {
  if (q.rows > kRowChunk) return false;
  if (q.rows <= 0 || tile.n <= 0) return true;
  const int64_t n32 = AmxRoundUp(tile.n, kAmxKeyAlign);
  Unit::Logits(LogitsArgs(q, tile, scratch, scratch.logits, n32));
  return lazy_softmax::Weights(StoredLogits{scratch.logits, n32, tile.n}, q.rows, tile.n, s,
                               logit_scale, state);
}

// acc += P V over the keys the rows need (KeysNeeded: the rest have weight
// 0). Whole 16-row tiles straight on acc; a last partial one on a
// copy of its rows padded with zero rows (TileScratch::tail_rows), because
// acc's rows past p.rows may be another kv head's (a task over several
// heads), and a tile's padding rows (zero weights) times an infinite or NaN
// value of V would reach them.
template <class Unit>
void Pv(const TileLogits& p, const KvTile& tile, const SoftmaxState& state,
        const TileScratch& scratch) {
  const int64_t keys = KeysNeeded(p, 0, p.rows, tile.n);
  if (p.rows <= 0 || keys <= 0) return;
  const uint16_t* weights = p.bf16_weights ? reinterpret_cast<const uint16_t*>(p.s)
                                           : WeightsToBf16InPlace(p, tile.n);
  const int64_t p_stride = AmxRoundUp(tile.n, kAmxKeyAlign);
  AmxPvBf16Args pv{weights,
                   p_stride,
                   p.rows / kAmxTileRows * kAmxTileRows,
                   PackedTileValues(tile, scratch),  // prepare_tile's.
                   keys,
                   tile.head_dim,
                   state.acc,
                   state.stride};
  if (pv.rows > 0) Unit::PvBf16(pv);
  const int64_t tail = p.rows - pv.rows;
  if (tail == 0) return;
  const size_t tail_bytes = sizeof(float) * static_cast<size_t>(tail * state.stride);
  float* acc_tail = state.acc + pv.rows * state.stride;
  std::memcpy(scratch.tail_rows, acc_tail, tail_bytes);
  std::memset(scratch.tail_rows + tail * state.stride, 0,
              sizeof(float) * static_cast<size_t>((kAmxTileRows - tail) * state.stride));
  pv.p_bf16 = weights + pv.rows * p_stride;
  pv.rows = tail;
  pv.acc = scratch.tail_rows;
  Unit::PvBf16(pv);
  std::memcpy(acc_tail, scratch.tail_rows, tail_bytes);
}

template <class Unit, DType kDtype>
constexpr ProductKernel kKernel = {
    Unit::kName,           QueryFormat::kBf16,
    PrepareBf16Row,        AccOrder::kNatural,
    /*e4m3_scaled=*/false, TilePacks<kDtype, NextTilePrefetch::kNone>::KeysAndValues,
    Logits<Unit>,          Pv<Unit>,
    Weights<Unit>};

}  // namespace amx_prefill

template <class Unit>
const ProductKernel* AmxPrefillOn(DType kv_dtype) {
  return KernelForKvDtype<ProductKernel, DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2,
                          DType::kI8>(
      kv_dtype, []<DType kDtype>() { return &amx_prefill::kKernel<Unit, kDtype>; });
}

}  // namespace rpa::internal
#endif  // __x86_64__

#endif  // RPA_SRC_KERNEL_AMX_PREFILL_H_
