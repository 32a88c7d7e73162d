// What an MLA kernel is: the per-worker scratch of a task (one layout
// function sizes it in the plan and carves it in the run), the tile of keys
// a kernel's products see, the kernel record and the one dispatch decision.
//
// A task's R rows (query tokens x heads, at most kMlaMaxRows) sit across
// vector lanes for the logits and the softmax, rows padded to R16 =
// RoundUp(R, 16): the logits of one key for all rows are a contiguous [R16]
// row, so the online softmax is elementwise across keys, and the logits
// broadcast one cache element (read in place from its page) against 16 rows
// of q. The accumulators are rows of dims, so PV broadcasts a row's weights
// against 16 dims of V:
//   st  [n][R16]          S^T = K Q^T          (MlaKernel::logits)
//   online softmax over st's keys, in place     (the task loop)
//   acc [R][dim_ckv]      acc += P V            (MlaKernel::pv)
// Dispatch (ChooseMlaKernel):
//   q bf16, K/V bf16 or fp8 e4m3fn, AMX tiles (CpuFeatures::amx_bf16:
//   Intel Sapphire Rapids on)                    mla_amx
//   the same dtypes, vdpbf16ps at the FMA's issue rate
//   (CpuFeatures::fast_bf16_dot: AMD Zen 4)      mla_avx512_bf16_pairs
//   anything else, any CPU                       mla_highway_f32
#ifndef RPA_SRC_MLA_MLA_KERNEL_H_
#define RPA_SRC_MLA_MLA_KERNEL_H_

#include <cstddef>
#include <cstdint>

#include "kernel/cpu_features.h"
#include "kernel/tile_kernel.h"  // NextTilePrefetch
#include "mla/mla_problem.h"

namespace rpa::internal {

inline int64_t MlaRoundUp(int64_t x, int64_t align) { return (x + align - 1) / align * align; }

// The extents a worker's scratch is sized for.
struct MlaScratchShape {
  int64_t rows_pad = 0;  // RoundUp(most rows of any task, 16).
  int64_t dim_ckv = 0;
  int64_t dim_kpe = 0;
};

// One worker's buffers, 64-byte aligned each.
// Row strides are the task's rows_pad (MlaKernelArgs), at most the plan's.
struct MlaScratch {
  float* qt = nullptr;         // [dim_ckv + dim_kpe][rows_pad] q transposed, f32.
  // q in bf16 for the pair kernel: [(dim_ckv + dim_kpe) / 2][rows_pad][2]
  // pairs across rows, or (up to 32 rows) whole rows [rows_pad][dim_ckv + dim_kpe].
  uint16_t* q_pairs = nullptr;
  float* st = nullptr;         // [kMlaTileKeys][rows_pad] logits, then weights.
  float* acc = nullptr;        // [rows_pad][dim_ckv] accumulators.
  float* m = nullptr;          // [rows_pad] running maximum.
  float* l = nullptr;          // [rows_pad] running sum.
  float* alpha = nullptr;      // [rows_pad] this tile's rescale of acc.
  int32_t* pos = nullptr;      // [rows_pad] query positions (INT32_MAX: padding rows).
  const void** ckv_rows = nullptr;  // [kMlaTileKeys] the tile's cache rows.
  const void** kpe_rows = nullptr;
  // The kernel's tile buffers: converted rows [kMlaTileKeys][dim_ckv +
  // dim_kpe] f32 (or bf16), then packs [kMlaTileKeys][dim_ckv] bf16 and
  // [kMlaTileKeys][rows_pad] bf16.
  void* tile = nullptr;
};

// Sizes (base == nullptr: returns the bytes) or carves (into `scratch`) one
// worker's buffers: the one function both plan and run call.
size_t LayoutMlaScratch(const MlaScratchShape& shape, void* base, MlaScratch* scratch);

// The keys of one tile as the products read them: row i of ckv and kpe.
struct MlaTile {
  DType dtype = DType::kBF16;  // Of the rows (after the kernel's prepare_tile).
  int64_t n = 0;               // 1..kMlaTileKeys.
  const void* const* ckv = nullptr;  // [n] rows of dim_ckv.
  const void* const* kpe = nullptr;  // [n] rows of dim_kpe.
};

// What every product of one task reads.
struct MlaKernelArgs {
  const MlaScratch* scratch = nullptr;
  int64_t rows = 0;      // The task's rows.
  int64_t rows_pad = 0;  // RoundUp(rows, 16): every [..][rows_pad] stride.
  int64_t dim_ckv = 0;
  int64_t dim_kpe = 0;
};

struct MlaKernel {
  const char* name;
  // Reads fp8 e4m3fn values as value * 2^-8 (kE4M3Rescale), which the task
  // loop undoes in the logit and output scales (MlaValueUnit).
  bool e4m3_scaled;
  // Whether the task loop prefetches the next tile's rows into L2 while
  // this one computes (NextTilePrefetch, tile_kernel.h).
  NextTilePrefetch next_tile;
  // Once per task: scratch->qt (exact copies of q's values) to the format
  // the kernel's logits read.
  void (*prepare_q)(const MlaKernelArgs& args);
  // Once per tile: the cache rows (of the cache's dtype) as rows the
  // products read, converted into scratch->tile where needed (exactly).
  MlaTile (*prepare_tile)(const MlaKernelArgs& args, const MlaTile& cache_rows);
  // st[i][r] = q_r . (ckv_i, kpe_i) for i < n, r < rows_pad.
  void (*logits)(const MlaKernelArgs& args, const MlaTile& tile);
  // acc[r][d] += sum_{i < n} st[i][r] * ckv_i[d] for r < rows, d < dim_ckv.
  void (*pv)(const MlaKernelArgs& args, const MlaTile& tile);
};

// What one unit of the kernel's K/V values is worth: the run's kv_scale,
// times kE4M3Rescale where the kernel reads e4m3fn scaled.
float MlaValueUnit(const MlaProblem& problem, const MlaKernel& kernel);

// Calls block.template operator()<k>(a) for blocks [a, a + k) covering
// [0, count): blocks of kMax, then the rest in blocks of 8, 4, 2 and 1
// (those below kMax), so a register-blocked product has a few fixed shapes.
template <int kMax, class Block>
void ForEachMlaBlock(int64_t count, const Block& block) {
  static_assert(kMax >= 1 && kMax <= 16);
  int64_t a = 0;
  for (; a + kMax <= count; a += kMax) block.template operator()<kMax>(a);
  auto tail = [&]<int kSize>() {
    if constexpr (kSize < kMax) {
      if (a + kSize <= count) {
        block.template operator()<kSize>(a);
        a += kSize;
      }
    }
  };
  tail.template operator()<8>();
  tail.template operator()<4>();
  tail.template operator()<2>();
  tail.template operator()<1>();
}

// The portable kernel (mla_highway.cc), on the best Highway target of this CPU.
const MlaKernel& MlaHighwayKernel();
#if defined(__x86_64__)
extern const MlaKernel kMlaAvx512Bf16Pairs;  // mla_avx512_bf16.cc
extern const MlaKernel kMlaAmx;              // mla_amx.cc
#endif

// The kernel for the problem's dtypes on a CPU with these features.
const MlaKernel& ChooseMlaKernel(const MlaProblem& problem, const CpuFeatures& cpu);

// Tests only: the kernel ChooseMlaKernel returns where mla_amx's calls meet
// emulated AMX tiles (CpuFeatures::amx_emulated): testing/amx_emulation.h
// installs mla_amx on its tile model. Once per process (later calls do
// nothing), from any thread.
void InstallTestMlaAmxKernel(const MlaKernel& kernel);

// Runs one task of the plan: its rows over its keys through `kernel`, into
// out / lse, or (task.partial_offset >= 0) into partials + partial_offset as
// [rows] m, [rows] l, [rows][dim_ckv] acc (natural order).
void RunMlaTask(const MlaProblem& problem, const MlaTask& task, const MlaKernel& kernel,
                const MlaScratch& scratch, float* partials);

}  // namespace rpa::internal

#endif  // RPA_SRC_MLA_MLA_KERNEL_H_
