// Which tile kernels this CPU runs, for people and logs: the kernel layer's
// dispatch table rows (docs/kernel.md, Dispatch) for this process.
#ifndef RPA_KERNELS_H_
#define RPA_KERNELS_H_

#include <string>

#include "rpa/dtype.h"
#include "rpa/export.h"

namespace rpa {

// For bf16 q over K/V of kv_dtype: a line naming the CPU features the
// dispatch uses and AMX's status (usable, or which step failed), then one
// line per class of task (decode, middle, prefill) with its kernels. What
// `rpa --version` and `python -m rpa` print.
RPA_EXPORT std::string DescribeKernels(DType kv_dtype);

// Which CPU this is, as CPUID names it: what a benchmark's JSON and the
// tuned block-size table record of the machine they ran on.
struct CpuInfo {
  std::string vendor;      // "AuthenticAMD", "GenuineIntel", ...; "" off x86-64.
  std::string model_name;  // /proc/cpuinfo's "model name" ("AMD EPYC 9R14 ..."), or "unknown".
  int family = 0;          // Display family and model (base + extended); 0 off x86-64.
  int model = 0;
  std::string features;    // The detected features dispatch reads ("avx512bw avx512bf16 ...").
};
// Detected once per process.
RPA_EXPORT const CpuInfo& ThisCpuInfo();

}  // namespace rpa

#endif  // RPA_KERNELS_H_
