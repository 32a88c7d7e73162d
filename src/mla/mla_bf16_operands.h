// The bf16 operands both bf16 MLA kernels build (mla_avx512_bf16_pairs and
// mla_amx; defined in mla_avx512_bf16.cc): q in pairs of dimensions across
// rows, and a tile's latent rows as bf16 rows in the tile scratch. x86-64
// with AVX-512 BF16 only.
#ifndef RPA_SRC_MLA_MLA_BF16_OPERANDS_H_
#define RPA_SRC_MLA_MLA_BF16_OPERANDS_H_

#include <cstdint>

#include "mla/mla_kernel.h"

#if defined(__x86_64__)
namespace rpa::internal {

// scratch->q_pairs [dim_qk / 2][row_stride][2] bf16:
// q_pairs[p][r] = (qt[2p][r], qt[2p + 1][r]) for r < rows_pad (exact for
// bf16 q), zero for rows in [rows_pad, row_stride); pairs p < dim_qk / 2.
void MlaQPairs(const MlaKernelArgs& args, int64_t row_stride);

// The tile's rows (bf16, or fp8 e4m3fn converted exactly) as bf16 rows
// [padded_n][row_stride] at scratch->tile: ckv's dim_ckv elements, then
// kpe's dim_kpe, then zeros; rows [n, padded_n) all zero. The tile's row
// pointers (scratch->ckv_rows, kpe_rows) then point there.
MlaTile MlaTileAsBf16Rows(const MlaKernelArgs& args, const MlaTile& rows, int64_t row_stride,
                          int64_t padded_n);

}  // namespace rpa::internal
#endif  // __x86_64__

#endif  // RPA_SRC_MLA_MLA_BF16_OPERANDS_H_
