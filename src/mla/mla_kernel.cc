// The MLA scratch layout and the dispatch decision (mla_kernel.h).
#include "mla/mla_kernel.h"

#include <atomic>

#include "kernel/tile_kernel.h"

namespace rpa::internal {

size_t LayoutMlaScratch(const MlaScratchShape& shape, void* base, MlaScratch* scratch) {
  const int64_t rows = shape.rows_pad;
  const int64_t dim_qk = shape.dim_ckv + shape.dim_kpe;
  size_t offset = 0;
  auto take = [&](int64_t bytes) {
    void* p = base == nullptr ? nullptr : static_cast<uint8_t*>(base) + offset;
    offset += static_cast<size_t>(MlaRoundUp(bytes, 64));  // A cache line each.
    return p;
  };
  MlaScratch s;
  s.qt = static_cast<float*>(take(dim_qk * rows * 4));
  // mla_amx's B operand takes dims and rows to multiples of 32.
  s.q_pairs = static_cast<uint16_t*>(take(MlaRoundUp(dim_qk, 32) * MlaRoundUp(rows, 32) * 2));
  s.st = static_cast<float*>(take(kMlaTileKeys * rows * 4));
  s.acc = static_cast<float*>(take(shape.dim_ckv * rows * 4));
  s.m = static_cast<float*>(take(rows * 4));
  s.l = static_cast<float*>(take(rows * 4));
  s.alpha = static_cast<float*>(take(rows * 4));
  s.pos = static_cast<int32_t*>(take(rows * 4));
  s.ckv_rows = static_cast<const void**>(take(kMlaTileKeys * sizeof(void*)));
  s.kpe_rows = static_cast<const void**>(take(kMlaTileKeys * sizeof(void*)));
  s.tile = take(kMlaTileKeys * (dim_qk * 4 + shape.dim_ckv * 2 + rows * 2));
  if (scratch != nullptr) *scratch = s;
  return offset;
}

float MlaValueUnit(const MlaProblem& problem, const MlaKernel& kernel) {
  const bool scaled = problem.kv_dtype == DType::kF8E4M3FN && kernel.e4m3_scaled;
  return (scaled ? kE4M3Rescale : 1.0f) * problem.kv_scale;
}

namespace {

std::atomic<const MlaKernel*> g_test_amx_kernel{nullptr};

}  // namespace

void InstallTestMlaAmxKernel(const MlaKernel& kernel) {
  const MlaKernel* none = nullptr;
  g_test_amx_kernel.compare_exchange_strong(none, &kernel, std::memory_order_acq_rel);
}

const MlaKernel& ChooseMlaKernel(const MlaProblem& problem, const CpuFeatures& cpu) {
#if defined(__x86_64__)
  const bool pair_dtypes = problem.q_dtype == DType::kBF16 &&
                           (problem.kv_dtype == DType::kBF16 ||
                            problem.kv_dtype == DType::kF8E4M3FN);
  if (pair_dtypes && cpu.amx_bf16 && !cpu.amx_emulated) return kMlaAmx;
  const MlaKernel* emulated = g_test_amx_kernel.load(std::memory_order_acquire);
  if (pair_dtypes && cpu.amx_emulated && emulated != nullptr) return *emulated;
  if (pair_dtypes && cpu.avx512bf16 && cpu.fast_bf16_dot) return kMlaAvx512Bf16Pairs;
#else
  (void)problem;
  (void)cpu;
#endif
  return MlaHighwayKernel();
}

}  // namespace rpa::internal
