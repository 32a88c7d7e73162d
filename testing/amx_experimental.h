// AMX code that no kernel dispatches, kept where the tests and
// rpa_amx_bench measure it (experimental: docs/kernel.md, Files), on either
// tile unit (testing/amx_emulation.h): the logits added to s (q as hi + lo
// bf16 halves for f32/f16 q), PV from f32 weights, the decode variant that
// reads K in place; and the tile unit's peak probe. Not part of librpa.
// x86-64 only.
#ifndef RPA_TESTING_AMX_EXPERIMENTAL_H_
#define RPA_TESTING_AMX_EXPERIMENTAL_H_

#if defined(__x86_64__)
#include <cstdint>

#include "kernel/amx.h"
#include "kernel/bf16_pairs.h"
#include "rpa/dtype.h"
#include "testing/amx_emulation.h"

namespace rpa::testing {

// As AmxLogits, but s[r * s_stride + i] += q_r . k_i, over all of s's
// [RoundUp(rows, 16)][RoundUp(n, 16)]: q = hi + lo in bf16 for f32/f16 q is
// AmxLogits of hi, then this of lo.
void AmxLogitsAdd(const internal::AmxLogitsArgs& args, AmxBackend backend);

struct AmxPvArgs {
  const float* p = nullptr;  // [rows][p_stride] f32 weights; columns [0, n) read.
  int64_t p_stride = 0;
  int64_t rows = 0;
  const uint16_t* v_packed = nullptr;  // AmxPackValues of n keys, head_dim dims.
  int64_t n = 0;
  int64_t head_dim = 0;
  float* acc = nullptr;  // As AmxPvBf16Args::acc.
  int64_t acc_stride = 0;
  uint16_t* p_bf16 = nullptr;  // Scratch: AmxPvScratchElems(rows, n) elements.
};
// acc[r * acc_stride + d] += sum_{i < n} bf16(p[r * p_stride + i]) * v_i[d]
// for r < rows, d < head_dim; bf16() rounds to nearest even (vcvtne2ps2bf16:
// f32 subnormal weights flush to zero). p is not modified.
void AmxPv(const AmxPvArgs& args, AmxBackend backend);

// ---- The decode variant: S^T = K Q^T for one query token's g = 1..32 q heads
// of a kv head. The A operand is 16 keys x 32 dims; for bf16 K with
// head_dim % 32 == 0 and 16 keys equally far apart (one page), it is
// loaded straight from the cache rows (stride = their distance, no
// repack); other blocks (a tile's last keys, rows across pages, dim tails,
// 8-bit K) are converted into scratch first. The B operand is Q^T, packed
// once per task by AmxPackQt. Uses its own tile configuration per g (one
// ldtilecfg when a thread switches between decode and AmxLogits/AmxPv).
// Not yet timed on an AMX CPU: dispatch to it once rpa_amx_bench's
// BM_DecodeLogits shows it beating WideLogits there.
// Q^T: [RoundUp(head_dim, 32) / 2][g][2] bf16.
inline int64_t AmxPackedQtElems(int64_t g, int64_t head_dim) {
  return internal::AmxRoundUp(head_dim, internal::kAmxDimAlign) * g;
}
// Scratch of AmxDecodeLogitsT: two converted key blocks, [2][16][RoundUp(
// head_dim, 32)] bf16.
inline int64_t AmxDecodeScratchElems(int64_t head_dim) {
  return 2 * internal::kAmxTileRows * internal::AmxRoundUp(head_dim, internal::kAmxDimAlign);
}
// out = Q^T of q's g rows ([g][q_stride] bf16, head_dim used), zero for
// dims >= head_dim. Plain C++.
void AmxPackQt(const uint16_t* q, int64_t q_stride, int64_t g, int64_t head_dim, uint16_t* out);

struct AmxDecodeLogitsArgs {
  DType dtype = DType::kBF16;           // K: bf16, e4m3fn, e5m2 or int8.
  const void* const* k_rows = nullptr;  // [n] cache rows, head_dim elements read.
  int64_t n = 0;
  int64_t head_dim = 0;
  const uint16_t* qt = nullptr;  // AmxPackQt of g rows.
  int64_t g = 0;                 // 1..32.
  float* st = nullptr;           // [RoundUp(n, 16)][st_stride >= g] f32.
  int64_t st_stride = 0;
  uint16_t* scratch = nullptr;  // AmxDecodeScratchElems(head_dim) elements.
};
// st[i * st_stride + j] = q_j . k_i for i < n, j < g; rows [n, RoundUp(n,
// 16)) of st get zeros, columns >= g are not written.
void AmxDecodeLogitsT(const AmxDecodeLogitsArgs& args, AmxBackend backend);

// The machine limit of one thread: 6 independent C tiles, tdpbf16ps on full
// 16x16x32 tiles back to back for about `seconds`. GFLOP/s (2 * 16 * 16 *
// 32 per instruction); 0 where internal::AmxSupport() is not
// usable. What `rpa bench` reports as the AMX limit (testing/machine.h).
double AmxBf16PeakGflops(double seconds);

}  // namespace rpa::testing

#endif  // __x86_64__
#endif  // RPA_TESTING_AMX_EXPERIMENTAL_H_
