// The MLA kernel on AMX tiles (mla_amx): both products by tdpbf16ps, bf16 in,
// f32 accumulation (kernel/amx.h's products).
//
// Logits: S^T = K Q^T, the tile's keys as the A operand (AMX's cost follows
// A's rows, and keys are the many: up to 128 a tile against 16-128 rows of
// heads) and q as B. The keys' rows are copied (fp8 e4m3fn converted
// exactly) into bf16 rows [RoundUp(n, 16)][RoundUp(dim_qk, 32)] (ckv, kpe,
// zeros); q is packed once per task into pairs of dims across rows,
// [dim_qk / 2][RoundUp(rows, 32)][2] (AmxLogits' packed-key layout, with rows
// as its keys). The logits land in st [n][R16], as the task loop's softmax
// wants them. PV: acc += P V with the weights transposed into rows
// [R16][kMlaTileKeys] bf16 (nearest even) and the ckv rows packed in key
// pairs (AmxPackValues). Error: the weights' bf16 rounding, as
// mla_avx512_bf16_pairs'.
//
// Scratch: the tile's bf16 rows at scratch->tile, the packed V after
// kMlaTileKeys * dim_qk * 4 bytes, the bf16 weights after kMlaTileKeys *
// dim_ckv * 2 more (LayoutMlaScratch's three tile buffers).
//
// Dispatch: bf16 q over bf16 or fp8 e4m3fn latents where the CPU has AMX
// (CpuFeatures::amx_bf16), mla_kernel.h.
#include "mla/mla_amx.h"

#if defined(__x86_64__)
#include <cstring>

#include "kernel/avx512_common.h"
#include "kernel/bf16_pairs.h"
#include "mla/mla_bf16_operands.h"

namespace rpa::internal {
namespace mla_amx {
namespace {

int64_t DimQk32(const MlaKernelArgs& args) {
  return AmxRoundUp(args.dim_ckv + args.dim_kpe, kAmxDimAlign);
}
int64_t Rows32(const MlaKernelArgs& args) { return AmxRoundUp(args.rows_pad, kAmxKeyAlign); }

uint16_t* PackedValues(const MlaKernelArgs& args) {
  return reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(args.scratch->tile) +
                                     kMlaTileKeys * (args.dim_ckv + args.dim_kpe) * 4);
}
uint16_t* Weights(const MlaKernelArgs& args) {
  return PackedValues(args) + kMlaTileKeys * args.dim_ckv;
}

// The weights st [n][R16] as bf16 rows [R16][kMlaTileKeys] (nearest even,
// vcvtne2ps2bf16), zero for keys in [n, RoundUp(n, 32)): a row's 32 keys
// at a time by two gathers down st's columns (against a scalar loop: the
// 128-head mla-decode 12-15% faster, docs/kernel_log.md).
RPA_AVX512_BF16_TARGET void TransposeWeights(const MlaKernelArgs& args, int64_t n, uint16_t* out) {
  const MlaScratch& s = *args.scratch;
  const __m512i column = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
      _mm512_set1_epi32(static_cast<int32_t>(args.rows_pad)));
  // Keys [i0, i0 + 16) of row r, zero past n.
  auto keys = [&](int64_t r, int64_t i0) RPA_AVX512_BF16_TARGET {
    const __mmask16 valid = n - i0 >= 16 ? __mmask16{0xFFFF}
                            : n - i0 <= 0 ? __mmask16{0}
                                          : static_cast<__mmask16>((1u << (n - i0)) - 1);
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid, column,
                                    s.st + i0 * args.rows_pad + r, 4);
  };
  for (int64_t r = 0; r < args.rows_pad; ++r) {
    uint16_t* row = out + r * kMlaTileKeys;
    for (int64_t i0 = 0; i0 < n; i0 += 32) {
      const __m512bh both = _mm512_cvtne2ps_pbh(keys(r, i0 + 16), keys(r, i0));
      _mm512_storeu_si512(row + i0, reinterpret_cast<__m512i>(both));
    }
  }
}

}  // namespace

// q as B (q_pairs, rows and dims to multiples of 32 zero: the keys' zero
// dims must not meet garbage), and acc's padding rows zero: the PV tiles
// load and store them back.
void PrepareQ(const MlaKernelArgs& args) {
  MlaQPairs(args, Rows32(args));
  const MlaScratch& s = *args.scratch;
  const int64_t dim_qk = args.dim_ckv + args.dim_kpe;
  std::memset(s.q_pairs + dim_qk * Rows32(args), 0,
              sizeof(uint16_t) * static_cast<size_t>((DimQk32(args) - dim_qk) * Rows32(args)));
  std::memset(s.acc + args.rows * args.dim_ckv, 0,
              sizeof(float) * static_cast<size_t>((args.rows_pad - args.rows) * args.dim_ckv));
}

MlaTile PrepareTile(const MlaKernelArgs& args, const MlaTile& rows) {
  return MlaTileAsBf16Rows(args, rows, DimQk32(args), AmxRoundUp(rows.n, 16));
}

// st[i][r] = q_r . k_i: the keys (prepared rows) as A, q pairs as B.
AmxLogitsArgs LogitsArgs(const MlaKernelArgs& args, const MlaTile& tile) {
  const MlaScratch& s = *args.scratch;
  return {static_cast<const uint16_t*>(s.tile), DimQk32(args), tile.n, s.q_pairs, args.rows_pad,
          args.dim_ckv + args.dim_kpe, s.st, args.rows_pad};
}

// acc[r][d] += sum_i P[r][i] ckv_i[d].
AmxPvBf16Args PvArgs(const MlaKernelArgs& args, const MlaTile& tile) {
  uint16_t* values = PackedValues(args);
  AmxPackValues({DType::kBF16, tile.ckv, tile.n, args.dim_ckv, values});
  uint16_t* weights = Weights(args);
  TransposeWeights(args, tile.n, weights);
  return {weights, kMlaTileKeys, args.rows, values, tile.n, args.dim_ckv, args.scratch->acc,
          args.dim_ckv};
}

}  // namespace mla_amx

namespace {

struct HardwareTiles : AmxHardwareTiles {
  static constexpr const char* kName = "mla_amx";
};

}  // namespace

const MlaKernel kMlaAmx = mla_amx::kKernelOn<HardwareTiles>;

}  // namespace rpa::internal

#endif  // __x86_64__
