#include "kernel/kernel_records.h"

#include <atomic>
#include <mutex>

#include "kernel/kernel.h"
#include "problem.h"

#if defined(__x86_64__)
#include "kernel/amx_prefill.h"
#include "kernel/avx512_bf16_lanes.h"
#include "kernel/avx512_bf16_packed.h"
#include "kernel/avx512_bf16_rows.h"
#include "kernel/avx512_fp16_decode.h"
#include "kernel/avx512_wide.h"
#endif

namespace rpa::internal {
namespace {

using enum TaskClass;

// The dtypes whose every value is a bf16: what the bf16 kernels take exactly.
constexpr uint32_t kBf16Q = DTypeBits({DType::kBF16});
constexpr uint32_t kBf16ExactKv =
    DTypeBits({DType::kBF16, DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8});
constexpr uint32_t kFp8 = DTypeBits({DType::kF8E4M3FN, DType::kF8E5M2});
// The 8-bit K/V whose codes are exact in f16 (avx512fp16_decode).
constexpr uint32_t kEightBitKv = DTypeBits({DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8});
constexpr uint32_t kWideKv =
    DTypeBits({DType::kBF16, DType::kF16, DType::kF8E4M3FN, DType::kF8E5M2, DType::kI8});
constexpr uint8_t kRowClasses = ClassBits({kDecode, kMiddle});
constexpr uint8_t kPrefillClass = ClassBits({kPrefill});
constexpr uint8_t kDecodeClass = ClassBits({kDecode});
constexpr uint8_t kMiddleClass = ClassBits({kMiddle});

#if defined(__x86_64__)
bool HasAvx512Bw(const CpuFeatures& f, DType) { return f.avx512bw; }
bool HasAvx512Fp16(const CpuFeatures& f, DType) { return f.avx512fp16; }
bool HasFastBf16Dot(const CpuFeatures& f, DType) { return f.fast_bf16_dot; }

// Where the bf16-pair decode and middle kernels pay: where vdpbf16ps issues
// at the FMA's rate, and for int8 K/V wherever AVX-512 BF16 is but not
// AVX512-FP16 (there int8 decode takes the f16 tile, avx512fp16_decode,
// and the widening kernels behind it: docs/kernel.md, Dispatch).
bool Bf16PairRowsPay(const CpuFeatures& f, DType kv_dtype) {
  return f.fast_bf16_dot || (kv_dtype == DType::kI8 && f.avx512bf16 && !f.avx512fp16);
}
#endif

const ProductKernel* HighwayRows(DType kv_dtype) { return HighwayKernelsForCpu(kv_dtype).rows; }
const ProductKernel* HighwayPacked(DType kv_dtype) {
  return HighwayKernelsForCpu(kv_dtype).packed;
}

}  // namespace

#if defined(__x86_64__)
KernelNeeds AmxPrefillNeeds(bool (*cpu)(const CpuFeatures&, DType)) {
  return {kBf16Q, kBf16ExactKv, ClassBits({kMiddle, kPrefill}), true, cpu};
}
#endif

namespace {

// Why this order: docs/kernel.md, Dispatch. Slot 0 is a test's record
// (InstallTestKernelRecord), empty until one is installed.
KernelRecord g_records[] = {
    {},
#if defined(__x86_64__)
    // ---- Products.
    {"amx_prefill", "amx_prefill.cc",
     AmxPrefillNeeds([](const CpuFeatures& f, DType) { return f.amx_bf16 && !f.amx_emulated; }),
     AmxPrefill},
    {"avx512_bf16_packed", "avx512_bf16_packed.cc",
     {kBf16Q, kBf16ExactKv, kPrefillClass, true,
      HasFastBf16Dot},
     Avx512Bf16Packed},
    {"avx512_bf16_lanes", "avx512_bf16_lanes.cc",
     {kBf16Q, kBf16ExactKv, kMiddleClass, true, HasFastBf16Dot},
     Avx512Bf16Lanes},
    {"avx512_bf16_rows", "avx512_bf16_rows.cc",
     {kBf16Q, kBf16ExactKv, kRowClasses, true, Bf16PairRowsPay},
     Avx512Bf16Rows},
    {"avx512_wide_fp8_scratch", "avx512_wide.cc",
     {kAnyDType, kFp8, kMiddleClass, true, HasAvx512Bw},
     Avx512WideFp8Scratch},
    {"avx512_wide", "avx512_wide.cc",
     {kAnyDType, kWideKv, kRowClasses, true, HasAvx512Bw},
     Avx512Wide},
#endif
    {"highway_packed", "highway_packed-inl.h", {kAnyDType, kAnyDType, kPrefillClass, true},
     HighwayPacked},
    {"highway_rows", "highway_rows-inl.h", {kAnyDType, kAnyDType, kRowClasses, true},
     HighwayRows},
#if defined(__x86_64__)
    // ---- Fused tiles (no soft cap: their exp has no tanh before it).
    {"avx512_bf16_lanes_tile", "avx512_bf16_lanes.cc",
     {kBf16Q, kBf16ExactKv, kMiddleClass, false, HasFastBf16Dot},
     nullptr, Avx512Bf16LanesTile},
    {"avx512_bf16_decode", "avx512_bf16_rows.cc",
     {kBf16Q, kBf16ExactKv, kDecodeClass, false, Bf16PairRowsPay},
     nullptr, Avx512Bf16Decode},
    {"avx512fp16_decode", "avx512_fp16_decode.cc",
     {kAnyDType, kEightBitKv, kDecodeClass, false, HasAvx512Fp16},
     nullptr, Avx512Fp16Decode},
    {"avx512_wide_decode", "avx512_wide.cc",
     {kAnyDType, kWideKv, kDecodeClass, false, HasAvx512Bw},
     nullptr, Avx512WideDecode},
#endif
};

// Whether slot 0 holds a record: set once, after the record is written.
std::atomic<bool> g_test_record{false};

}  // namespace

std::span<const KernelRecord> KernelRecords() {
  return std::span<const KernelRecord>(g_records).subspan(
      g_test_record.load(std::memory_order_acquire) ? 0 : 1);
}

void InstallTestKernelRecord(const KernelRecord& record) {
  static std::once_flag once;
  std::call_once(once, [&] {
    g_records[0] = record;
    g_test_record.store(true, std::memory_order_release);
  });
}

bool Meets(const KernelRecord& record, const AttentionProblem& problem, TaskClass c,
           const CpuFeatures& cpu) {
  const KernelNeeds& n = record.needs;
  auto has = [](uint32_t bits, DType d) { return ((bits >> static_cast<int>(d)) & 1u) != 0; };
  const bool plain_exp = problem.soft_cap == 0.0f && problem.alibi_slopes == nullptr;
  return has(n.q_dtypes, problem.q_dtype) && has(n.kv_dtypes, problem.kv_dtype) &&
         ((n.classes >> static_cast<int>(c)) & 1u) != 0 && (n.soft_cap_or_alibi || plain_exp) &&
         (n.cpu == nullptr || n.cpu(cpu, problem.kv_dtype));
}

}  // namespace rpa::internal
