// The reference implementation: the oracle every other path is tested
// against (docs/contract.md §1). One sequence at a time, f64 accumulation, no tiling;
// validates exactly as the fast entry points do. Slow by design.
#ifndef RPA_REFERENCE_H_
#define RPA_REFERENCE_H_

#include "rpa/attention.h"
#include "rpa/export.h"
#include "rpa/options.h"
#include "rpa/tensor.h"

namespace rpa {

RPA_EXPORT void RefRaggedPagedAttention(const TensorView& q, const TensorView& kv_pages,
                                        const PageTable& page_table,
                                        const AttentionOptions& options,
                                        const MutableTensorView& out);

RPA_EXPORT void RefRaggedPagedAttention(const TensorView& q, const KVPages& kv,
                                        const PageTable& page_table,
                                        const AttentionOptions& options,
                                        const MutableTensorView& out);

}  // namespace rpa

#endif  // RPA_REFERENCE_H_
