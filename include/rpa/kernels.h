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

}  // namespace rpa

#endif  // RPA_KERNELS_H_
