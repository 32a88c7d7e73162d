// The attention kernel's tasks and the per-worker scratch they run in.
//
// One task is (sequence, kv head, query tile, KV chunk): the rows of the task
// are the query tile's tokens times the q heads that share the kv head,
// row r = (token qt_begin + r / G, q head kv_head * G + r % G), so each K/V
// element is loaded from memory once per query tile. The run walks the KV
// chunk in tiles of kv_block tokens with a flash-attention online softmax.
#ifndef RPA_SRC_KERNEL_KERNEL_H_
#define RPA_SRC_KERNEL_KERNEL_H_

#include <cstdint>

#include "problem.h"

namespace rpa::internal {

// How QK^T and PV are multiplied.
enum class KernelPath : uint8_t {
  kHighway,     // f32 FMA on the dispatched Highway target; every dtype.
  kAvx512Bf16,  // vdpbf16ps for bf16 and 8-bit float K/V; needs CpuHasAvx512Bf16().
  // bf16 and 8-bit float K/V widened to f32 in registers, f32 FMA
  // (AVX-512F/BW/VL): where vdpbf16ps issues at half the FMA rate (the
  // machine measured in docs/kernel.md), twice its arithmetic.
  kAvx512Wide,
};

// Rows of a KV tile padded to this many tokens, head_dim to kDimAlign: the
// widest vector (16 f32 / 32 bf16) then never needs a tail inside scratch.
inline constexpr int64_t kTokenAlign = 16;
inline constexpr int64_t kDimAlign = 32;
// Keys of a packed K tile are padded to twice the widest vector.
inline constexpr int64_t kPackedTokenAlign = 32;

inline int64_t RoundUp(int64_t x, int64_t align) { return (x + align - 1) / align * align; }

struct KernelTask {
  int32_t seq = 0;
  // KV heads [kv_head, kv_head_end). Decode-like tiles (few rows per kv head)
  // take every kv head of the sequence in one task, so K/V are read page by
  // page, whole token rows at a time, instead of 512 B out of every 4 KiB.
  // Rows are kv-head major: row r = (kv head kv_head + r / RH, token
  // q_begin + (r % RH) / G, q head (kv head) * G + r % G), RH = q tokens x G.
  int32_t kv_head = 0;
  int32_t kv_head_end = 1;
  int32_t q_begin = 0;  // Query tokens [q_begin, q_end) of the sequence.
  int32_t q_end = 0;
  int32_t kv_begin = 0;  // Keys [kv_begin, kv_end); may be empty.
  int32_t kv_end = 0;
  // -1: the task owns its rows' whole KV range and writes problem.out.
  // Else: it writes a partial (m, l, acc) at this float offset of the plan's
  // partial buffer, merged later by log-sum-exp.
  int64_t partial_offset = -1;
};

// Per-worker scratch; sized by the plan for max_rows rows and kv_block keys.
struct WorkerScratch {
  int64_t dim_pad = 0;    // RoundUp(head_dim, kDimAlign).
  int64_t token_pad = 0;  // RoundUp(kv_block, kTokenAlign).
  float* q = nullptr;      // [max_rows, dim_pad] f32, zero padded.
  uint16_t* q_hi = nullptr;  // [max_rows, dim_pad] bf16 high part of q.
  uint16_t* q_lo = nullptr;  // [max_rows, dim_pad] bf16 of q - q_hi.
  float* q_eo = nullptr;     // [max_rows, dim_pad] q in WideQIndex order.
  uint16_t* q_half = nullptr;   // [max_rows, RoundUp(dim_pad, kHalfDimAlign)] QRowToHalf rows.
  float* q_half_unscale = nullptr;  // [max_rows] their QRowToHalf factors.
  float* s = nullptr;      // [max_rows, token_pad] logits, then weights.
  float* acc = nullptr;    // [max_rows, dim_pad] output accumulators.
  float* m = nullptr;      // [max_rows] running max.
  float* l = nullptr;      // [max_rows] running sum.
  const void** k_rows = nullptr;  // [token_pad] K row of each tile key.
  const void** v_rows = nullptr;  // [token_pad] V row of each tile key.
  uint16_t* kv_bf16 = nullptr;    // [token_pad, dim_pad] 8-bit float K or V as bf16.
  // A packed tile (kPackedMinRows or more rows per kv head): K transposed,
  // [dim_pad, RoundUp(n, 2 * lanes)], then V, [n, dim_pad], as f32.
  float* packed = nullptr;
  const void** k_next = nullptr;  // [token_pad] K rows of the next tile (prefetch).
  const void** v_next = nullptr;  // [token_pad] V rows of the next tile.
  // [2][token_pad] each: kv head task.kv_head's K / V row of each key of the
  // current and the next tile (ping-pong); other heads are a fixed offset.
  const uint8_t** k_base = nullptr;
  const uint8_t** v_base = nullptr;
};

// Partial of a split task: [rows] m, [rows] l, [rows, dim_pad] acc.
inline int64_t PartialFloats(int64_t rows, int64_t dim_pad) { return rows * (2 + dim_pad); }

// Runs one task on the best compiled Highway target the CPU supports (or the
// one forced by hwy::SetSupportedTargetsForTest).
void RunKernelTask(const AttentionProblem& problem, const KernelTask& task, int64_t kv_block,
                   KernelPath path, const WorkerScratch& scratch, float* partials);

// The path ComputeAttention takes: the bf16 dot path for bf16, fp8 e4m3fn
// and fp8 e5m2 K/V when the CPU has it and it is allowed, else Highway.
KernelPath ChooseKernelPath(const AttentionProblem& problem);
// Test and benchmark hook (process-wide): false keeps bf16 K/V on the
// Highway path, so both paths can be checked on one machine.
void AllowBf16DotPath(bool allow);

// Test and benchmark hook (process-wide): true makes the AVX-512 BF16 dot
// path the choice for bf16/fp8 K/V where the CPU has it, instead of the
// widening path.
void PreferBf16Dot(bool prefer);

// Whether this CPU (and OS) run AVX-512 F, BW and VL.
bool CpuHasAvx512Bw();
// Whether it also runs AVX512-FP16 (f16 arithmetic).
bool CpuHasAvx512Fp16();
// Whether 8-bit float decode tiles run in f16 (HalfDecodeTile):
// CpuHasAvx512Fp16() unless switched off by AllowHalfDecode(false).
bool HalfDecodeEnabled();
// Test and benchmark hook (process-wide): false keeps 8-bit float decode on
// the widening path's f32 arithmetic, so both can be checked on one machine.
void AllowHalfDecode(bool allow);

// Whether this CPU (and OS) run AVX-512 BF16: avx512f/bw/vl/bf16 plus zmm
// state enabled in XCR0.
bool CpuHasAvx512Bf16();

// ---- The AVX-512 BF16 path (avx512_bf16.cc); call only if CpuHasAvx512Bf16.

// s[r * s_stride + i] = dot(q_r, k_i) over head_dim for r < rows, i < tokens;
// q rows are bf16 with q_stride elements, zero padded to RoundUp(head_dim,
// 32); q_lo (may be null) is added as a second bf16 term. k_rows[i] points at
// head_dim bf16 values; nothing beyond them is read.
// prefetch_rows (may be null): rows [0, prefetch_count) of the next tile,
// brought into L2 while this one is computed (key i's product issues row
// i's prefetches, so the misses overlap the arithmetic evenly).
void Bf16Logits(const uint16_t* q_hi, const uint16_t* q_lo, int64_t q_stride, int64_t rows,
                const void* const* k_rows, int64_t tokens, int64_t head_dim, float* s,
                int64_t s_stride, const void* const* prefetch_rows = nullptr,
                int64_t prefetch_count = 0);

// acc_r += sum_i p[r * p_stride + i] * v_i for r < rows, with p exactly
// representable in bf16 (p is packed in place, so consumed). acc rows
// (acc_stride floats, >= RoundUp(head_dim, 32)) are kept in the interleaved
// order of Bf16AccIndex.
void Bf16AccumulatePV(float* p, int64_t p_stride, int64_t rows, const void* const* v_rows,
                      int64_t tokens, int64_t head_dim, float* acc, int64_t acc_stride,
                      const void* const* prefetch_rows = nullptr, int64_t prefetch_count = 0);

// 8-bit float K/V on the bf16 path: every e4m3fn value times 2^-8 (the
// Highway path's kE4M3Rescale, undone in the scales) and every e5m2 value is
// a normal bf16 number, so a tile's rows convert exactly, in registers (two
// vpermi2w look 32 magnitudes up in a 128-entry table, the sign is or-ed
// back), into bf16 rows at dst (dst_stride elements apart, zero padded to a
// multiple of 32); rows[i] is repointed there.
void Fp8RowsToBf16(DType dtype, const void** rows, int64_t tokens, int64_t head_dim,
                   uint16_t* dst, int64_t dst_stride);

// ---- The widening path (avx512_bf16.cc); call only if CpuHasAvx512Bw.
// As Bf16Logits, with q rows in f32 in the order of WideQIndex (zero padded
// to a multiple of 32) and K rows of k_dtype: bf16, or fp8 e4m3fn / e5m2
// converted in registers exactly as Fp8RowsToBf16 would (e4m3fn times
// 2^-8), chunk by chunk inside the product loop. Every row block converts
// the chunk again, so for many rows (prefill) Fp8RowsToBf16 once per tile
// and k_dtype bf16 costs less; decode (<= 8 rows per kv head) converts here.
// prefetch_bytes: bytes of each prefetched row (the rows prefetched are
// the next tile's in the cache's dtype, which may be 8-bit).
void WideLogits(DType k_dtype, const float* q_eo, int64_t q_stride, int64_t rows,
                const void* const* k_rows, int64_t tokens, int64_t head_dim, float* s,
                int64_t s_stride, const void* const* prefetch_rows, int64_t prefetch_count,
                int64_t prefetch_bytes);
// acc_r += sum_i p[r * p_stride + i] * v_i (f32 weights, V rows of v_dtype
// as in WideLogits); acc rows in the order of WideQIndex.
void WidePv(DType v_dtype, const float* p, int64_t p_stride, int64_t rows,
            const void* const* v_rows, int64_t tokens, int64_t head_dim, float* acc,
            int64_t acc_stride, const void* const* prefetch_rows, int64_t prefetch_count,
            int64_t prefetch_bytes);
// Decode's common case on the widening path, fused: up to 4 rows of one kv
// head (its q heads at one query token, or fewer heads at more tokens) over
// a tile of tokens <= kWideDecodeMaxKeys keys that every row sees (no mask
// inside the tile, no soft cap): logits, the online-softmax update of m, l
// and acc (as SoftmaxRow does it, the rows' reductions in one vector) and
// PV, with the weights kept in a 2 KiB stack block instead of the logits
// scratch. Arguments as in WideLogits / WidePv, except that key i's rows
// are k_rows[i] + k_offset and v_rows[i] + v_offset bytes (and so are the
// next tile's; k_next null: no prefetch), so one pointer array serves every
// kv head; logit_scale multiplies the logits. rows (1-4) rows are computed
// as four (the last repeated), so fewer than 3 cost more than WideLogits.
// Returns false, with m, l and acc untouched, where a logit is NaN or a
// row's maximum is not finite (or m is NaN): those take SoftmaxRow's path.
inline constexpr int64_t kWideDecodeMaxKeys = 32;
bool WideDecodeTile(DType kv_dtype, const float* q_eo, int64_t q_stride, int64_t rows,
                    const uint8_t* const* k_rows, const uint8_t* const* v_rows,
                    int64_t k_offset, int64_t v_offset, int64_t tokens, int64_t head_dim,
                    float logit_scale, float* m, float* l, float* acc, int64_t acc_stride,
                    const uint8_t* const* k_next, const uint8_t* const* v_next,
                    int64_t next_count, int64_t row_bytes);
// ---- 8-bit float decode in f16 arithmetic (avx512_bf16.cc); call only if
// CpuHasAvx512Fp16. q rows for it: row q (f32, head_dim) scaled by a power
// of 2 (no f16 sum of its products with kv_dtype codes can overflow) and
// stored at out as f16 in the tile's order (RoundUp(head_dim, 64) halves);
// returns the factor that undoes the scaling, for the tile's logits.
inline constexpr int64_t kHalfDimAlign = 64;
float QRowToHalf(DType kv_dtype, const float* q, int64_t head_dim, uint16_t* out);
// As WideDecodeTile for e4m3fn or e5m2 K/V, with q from QRowToHalf
// (q_stride halves apart, q_unscale[r] its return values): products and the
// tile's sums in f16 (~4e-4 of a logit, ~1e-3 of |V|), softmax and acc in
// f32. Returns false, with m, l and acc untouched, in WideDecodeTile's
// cases, where a K or V code in the tile is NaN or infinite, and where the
// tile's largest |logit| exceeds 16 (its f16 rounding would then move the
// dominant weights by more than ~0.6%).
bool HalfDecodeTile(DType kv_dtype, const uint16_t* q_half, int64_t q_stride,
                    const float* q_unscale, int64_t rows, const uint8_t* const* k_rows,
                    const uint8_t* const* v_rows, int64_t k_offset, int64_t v_offset,
                    int64_t tokens, int64_t head_dim, float logit_scale, float* m, float* l,
                    float* acc, int64_t acc_stride, const uint8_t* const* k_next,
                    const uint8_t* const* v_next, int64_t next_count, int64_t row_bytes);
// Where dimension d lives on the widening path: within each 32-dimension
// chunk, the even dimensions first, then the odd ones.
inline int64_t WideQIndex(int64_t d) {
  const int64_t i = d & 31;
  return (d & ~int64_t{31}) + (i & 1) * 16 + (i >> 1);
}

// Prefetches the cache lines of the `bytes` bytes at p into L2.
inline void PrefetchRow(const void* p, int64_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const uintptr_t last = (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes) - 1) &
                         ~uintptr_t{63};
  for (uintptr_t line = first; line <= last; line += 64) {
    __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 2);
  }
}

// Where dimension d lives in a Bf16AccumulatePV accumulator row: within each
// 32-dimension chunk, vpunpck{l,h}wd put dimensions {0-3, 8-11, 16-19, 24-27}
// in the first 16 floats and {4-7, ...} in the next 16.
inline int64_t Bf16AccIndex(int64_t d) {
  const int64_t chunk = d & ~int64_t{31};
  const int64_t i = d & 31;
  const int64_t half = (i >> 2) & 1;  // Odd groups of 4 go to the high half.
  const int64_t lane128 = i >> 3;     // Which 128-bit lane.
  return chunk + half * 16 + lane128 * 4 + (i & 3);
}

}  // namespace rpa::internal

#endif  // RPA_SRC_KERNEL_KERNEL_H_
