// Intel AMX for the attention kernel: detection and the per-process tile
// permission, the per-thread tile configuration, and the two products of a
// task's rows over one KV tile of one kv head on the hardware's tiles, bf16
// in, f32 out:
//   S = Q K^T    (AmxLogits: A = q rows, B = K packed by AmxPackKeys)
//   O += P V     (AmxPvBf16: A = P as bf16, B = V packed by AmxPackValues)
// (the packs: bf16_pairs.h). The online softmax between them stays with the
// caller (AVX-512). The tile programs are amx_tile_programs.h's; the scalar
// tile model they also run on, and what no kernel dispatches (AmxPv, the
// decode variant, the hi + lo accumulation, the peak probe), are testing/'s
// (amx_emulation.h, amx_experimental.h).
//
// Tiles: one palette-1 configuration, every tile 16 rows x 64 bytes (A: 16
// rows x 32 bf16; B: 16 pair rows x 16 columns x 2 bf16; C: 16 x 16 f32),
// so a thread loads it once and keeps it (thread_local). Products are
// blocked 2 A x 2 B -> 4 C tiles (32 rows x 32 keys or dims), with single
// tiles at the odd edges.
//
// Row tails: tiles always have 16 rows, so the q, s and acc buffers must
// have RoundUp(rows, 16) rows allocated: rows [rows, RoundUp(rows, 16)) of
// q are read (any finite or NaN values: rows never mix), and the same rows
// of s and acc are written with garbage. Key and dimension tails are zero
// in the packed layouts, so they contribute exact zeros.
//
// Alignment: none required; 64-byte aligned buffers and strides that are
// multiples of 64 bytes keep every tile row in one cache line.
//
// Everything but AmxSupport() exists on x86-64 only. Call the products only
// where AmxSupport().usable.
#ifndef RPA_SRC_KERNEL_AMX_H_
#define RPA_SRC_KERNEL_AMX_H_

#include <cstdint>
#include <string>

namespace rpa::internal {

struct AmxStatus {
  bool usable = false;
  std::string reason;  // "AMX bf16 tiles usable", or which step failed.
};

// CPUID (amx-tile, amx-bf16, avx512f/bw/vl, avx512-bf16), OSXSAVE and XCR0
// (tile config + data, opmask/zmm state), then one arch_prctl(
// ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) for the process. Computed once
// (thread-safe static); every thread may use the tiles afterwards.
const AmxStatus& AmxSupport();

#if defined(__x86_64__)

inline constexpr int64_t kAmxTileRows = 16;  // Rows of an A or C tile.

struct AmxLogitsArgs {
  // [RoundUp(rows, 16)][q_stride] bf16, q_stride >= RoundUp(head_dim, 32);
  // dims [head_dim, RoundUp(head_dim, 32)) of rows < rows zero (finite).
  const uint16_t* q = nullptr;
  int64_t q_stride = 0;
  int64_t rows = 0;  // 1..any (a prefill task: ~512).
  const uint16_t* k_packed = nullptr;  // AmxPackKeys of n keys, head_dim dims.
  int64_t n = 0;
  int64_t head_dim = 0;
  // [RoundUp(rows, 16)][s_stride], s_stride >= RoundUp(n, 16): columns
  // [n, RoundUp(n, 16)) and rows >= rows get garbage (zero products / q's
  // padding rows).
  float* s = nullptr;
  int64_t s_stride = 0;
};
// s[r * s_stride + i] = q_r . k_i (f32 sum of exact bf16 products) for r <
// rows, i < n. No scratch. Uses tiles 0-7 (reconfigures if needed).
void AmxLogits(const AmxLogitsArgs& args);

struct AmxPvBf16Args {
  // [RoundUp(rows, 16)][p_stride] bf16, p_stride >= RoundUp(n, 32); keys
  // [n, RoundUp(n, 32)) finite (zero); rows >= rows reach only acc's rows
  // >= rows.
  const uint16_t* p_bf16 = nullptr;
  int64_t p_stride = 0;
  int64_t rows = 0;
  const uint16_t* v_packed = nullptr;  // AmxPackValues of n keys, head_dim dims.
  int64_t n = 0;
  int64_t head_dim = 0;
  // [RoundUp(rows, 16)][acc_stride] f32, natural dimension order,
  // acc_stride >= RoundUp(head_dim, 16); columns [head_dim, RoundUp(head_dim,
  // 16)) get += 0, rows >= rows are loaded and stored back (+= 0).
  float* acc = nullptr;
  int64_t acc_stride = 0;
};
// acc[r * acc_stride + d] += sum_{i < n} p_bf16[r * p_stride + i] * v_i[d].
void AmxPvBf16(const AmxPvBf16Args& args);

// These two products as the tile unit the AMX kernels are written over
// (amx_prefill.h, mla/mla_amx.h); each kernel's unit adds its kName.
struct AmxHardwareTiles {
  static void Logits(const AmxLogitsArgs& args) { AmxLogits(args); }
  static void PvBf16(const AmxPvBf16Args& args) { AmxPvBf16(args); }
};

// tilerelease: returns the thread's tiles to their init state (the kernel
// then skips saving ~8 KiB of tile data on context switches) and forgets
// the thread's current configuration, so the next product reloads it. The
// thread pool runs it as a worker-idle hook (amx_tiles.cc registers it) when a
// thread's share of a ParallelFor is done; also call it after other
// code on the thread (oneDNN) configured tiles. Hardware only.
void AmxReleaseTiles();

#endif  // defined(__x86_64__)

}  // namespace rpa::internal

#endif  // RPA_SRC_KERNEL_AMX_H_
