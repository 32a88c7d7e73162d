// The AMX prefill kernel: both products of a prefill task on Intel AMX
// tiles, bf16 in, f32 accumulation (amx.h has the products, bf16_pairs.h the
// packs).
//
// Arithmetic: per KV tile, K is packed once into the VNNI pair layout
// ([RoundUp(head_dim, 32) / 2][RoundUp(n, 32)][2] bf16; fp8 and int8
// converted exactly, e4m3fn at its true value) and every 16-row block of q
// [rows, dim_pad] bf16 multiplies it: S = Q K^T in f32 (tdpbf16ps). The
// task loop's softmax (AVX-512) turns S into f32 weights; they are rounded
// to bf16 in place, as flash attention does on GPUs, V is packed in pairs of
// keys ([RoundUp(n, 32) / 2][RoundUp(head_dim, 16)][2]) and acc += P V in
// f32. The error over the f32 path is the weights' bf16 rounding (2^-9
// relative each; the LSE sums the unrounded weights) and q's for non-bf16 q
// (dispatch gives this kernel bf16 q only).
//
// Shapes: tiles always have 16 rows, so a kv head's rows run to a multiple
// of 16 from their first (kRowAlign; in a task over several kv heads the
// scratch is padded for the last head's, ScratchRows in scratch.cc): the
// logits' extra rows land in the next head's rows (computed again when its
// turn comes) or in padding; PV keeps them off acc (Pv below). The packed K
// and V take TileScratch::packed (one after the other: PV packs V over the
// logits' K); the bf16 weights overwrite their own f32 logits row by row.
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
#include "kernel/bf16_pairs.h"
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

template <class Unit, DType kDtype>
void Logits(const QueryRows& q, const KvTile& tile, const TileLogits& s,
            const TileScratch& scratch) {
  if (q.rows <= 0 || tile.n <= 0) return;
  const uint16_t* k_packed = TilePacks<kDtype, NextTilePrefetch::kNone>::Keys(tile, scratch);
  Unit::Logits({static_cast<const uint16_t*>(q.data), q.stride, q.rows, k_packed, tile.n,
                tile.head_dim, s.s, s.stride});
}

// acc += P V. Whole 16-row tiles straight on acc; a last partial one on a
// copy of its rows padded with zero rows (behind the packed V in
// TileScratch::packed: V takes at most half of it, and the other half holds
// at least 32 rows of dim_pad floats), because acc's rows past p.rows may be
// another kv head's (a task over several heads), and a tile's padding rows
// (zero weights) times an infinite or NaN value of V would reach them.
template <class Unit, DType kDtype>
void Pv(const TileLogits& p, const KvTile& tile, const SoftmaxState& state,
        const TileScratch& scratch) {
  if (p.rows <= 0 || tile.n <= 0) return;
  const uint16_t* v_packed = TilePacks<kDtype, NextTilePrefetch::kNone>::Values(tile, scratch);
  const uint16_t* weights = WeightsToBf16InPlace(p, tile.n);
  const int64_t p_stride = AmxRoundUp(tile.n, kAmxKeyAlign);
  AmxPvBf16Args pv{weights, p_stride, p.rows / kAmxTileRows * kAmxTileRows, v_packed, tile.n,
                   tile.head_dim, state.acc, state.stride};
  if (pv.rows > 0) Unit::PvBf16(pv);
  const int64_t tail = p.rows - pv.rows;
  if (tail == 0) return;
  const size_t tail_bytes = sizeof(float) * static_cast<size_t>(tail * state.stride);
  float* rows = reinterpret_cast<float*>(
      reinterpret_cast<uint8_t*>(scratch.packed) +
      sizeof(uint16_t) * AmxPackedValuesElems(tile.n, tile.head_dim));
  float* acc_tail = state.acc + pv.rows * state.stride;
  std::memcpy(rows, acc_tail, tail_bytes);
  std::memset(rows + tail * state.stride, 0,
              sizeof(float) * static_cast<size_t>((kAmxTileRows - tail) * state.stride));
  pv.p_bf16 = weights + pv.rows * p_stride;
  pv.rows = tail;
  pv.acc = rows;
  Unit::PvBf16(pv);
  std::memcpy(acc_tail, rows, tail_bytes);
}

template <class Unit, DType kDtype>
constexpr ProductKernel kKernel = {Unit::kName,          QueryFormat::kBf16,
                                   PrepareBf16Row,       AccOrder::kNatural,
                                   /*e4m3_scaled=*/false, /*prepare_tile=*/nullptr,
                                   Logits<Unit, kDtype>,  Pv<Unit, kDtype>};

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
