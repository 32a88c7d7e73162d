// The one list of tile kernels: for each, its name, its file, what it needs
// of the call and the CPU, and its functions. Dispatch (dispatch.cc) walks
// it in order, `rpa explain` and the dispatch tests read it: a kernel is
// added by one record here (and its file).
#ifndef RPA_SRC_KERNEL_KERNEL_RECORDS_H_
#define RPA_SRC_KERNEL_KERNEL_RECORDS_H_

#include <cstdint>
#include <initializer_list>
#include <span>

#include "kernel/cpu_features.h"
#include "kernel/task.h"
#include "kernel/tile_kernel.h"
#include "rpa/dtype.h"

namespace rpa::internal {

// A set of dtypes or of task classes as bits.
inline constexpr uint32_t DTypeBits(std::initializer_list<DType> dtypes) {
  uint32_t bits = 0;
  for (DType d : dtypes) bits |= 1u << static_cast<int>(d);
  return bits;
}
inline constexpr uint32_t kAnyDType = ~uint32_t{0};
inline constexpr uint8_t ClassBits(std::initializer_list<TaskClass> classes) {
  uint8_t bits = 0;
  for (TaskClass c : classes) bits = static_cast<uint8_t>(bits | (1u << static_cast<int>(c)));
  return bits;
}

// What a kernel needs of the call and the CPU to be chosen.
struct KernelNeeds {
  uint32_t q_dtypes = kAnyDType;   // DTypeBits
  uint32_t kv_dtypes = kAnyDType;  // DTypeBits
  uint8_t classes = 0;             // ClassBits: the task classes it runs.
  bool soft_cap_or_alibi = true;   // Runs calls with a soft cap or ALiBi slopes
                                   // (the fused tiles' exp takes neither a tanh nor a bias).
  // Whether the CPU's features (UsableCpuFeatures) have what it needs and
  // make it pay for K/V of this dtype (one of kv_dtypes); null: always.
  bool (*cpu)(const CpuFeatures&, DType kv_dtype) = nullptr;
};

struct KernelRecord {
  const char* name;
  const char* file;  // Under src/kernel/ (a test's record: from the source root).
  KernelNeeds needs;
  // Exactly one of the two: the unfused products (for this Highway target
  // where they are Highway code), or a fused decode tile, each as the
  // kernel's instance for K/V of kv_dtype: not null for every dtype of
  // needs.kv_dtypes (dispatch resolves it once per plan).
  const ProductKernel* (*products)(DType kv_dtype) = nullptr;
  const FusedTileKernel* (*fused)(DType kv_dtype) = nullptr;
};

// amx_prefill's needs, with the CPU test given: bf16 q, K/V whose values
// are bf16 (bf16, fp8, int8), the middle and prefill classes (from 9 rows
// per kv head, packing K and V once per tile pays on AMX: docs/kernel.md),
// soft caps and ALiBi too. One definition for the hardware's record and its
// scalar tile model's (testing/amx_emulation.cc).
KernelNeeds AmxPrefillNeeds(bool (*cpu)(const CpuFeatures&, DType));

// Every kernel of this build (the AVX-512 ones only on x86-64), products
// and fused tiles, in the order dispatch tries them: for each class of
// task, the first products whose needs the call and CPU meet, then up to two
// fused tiles in order whose needs are met and that agree with those
// products (same accumulator order and e4m3fn unit). A test's installed
// record comes first.
std::span<const KernelRecord> KernelRecords();

// Tests only: adds a kernel librpa does not build to the front of the list,
// once per process (later calls do nothing); it should need a CPU feature
// only tests set, as testing/amx_emulation.h's AMX tile model does
// (CpuFeatures::amx_emulated). Install before the calls it should reach,
// from any thread: the list never changes again.
void InstallTestKernelRecord(const KernelRecord& record);

struct AttentionProblem;

// Whether the record's needs hold for a call of this problem's dtypes and
// soft cap, a task of class c, on a CPU with these usable features.
bool Meets(const KernelRecord& record, const AttentionProblem& problem, TaskClass c,
           const CpuFeatures& cpu);

}  // namespace rpa::internal

#endif  // RPA_SRC_KERNEL_KERNEL_RECORDS_H_
