// Input validation, callable on its own as JAX's static_validate_inputs /
// dynamic_validate_inputs are. Every entry point runs both (and checks its
// output view) before it writes anything. Messages: docs/contract.md §3.
#ifndef RPA_VALIDATE_H_
#define RPA_VALIDATE_H_

#include "rpa/attention.h"
#include "rpa/export.h"
#include "rpa/options.h"
#include "rpa/tensor.h"

namespace rpa {

// Shapes, dtypes, layouts and options: nothing that reads the metadata's
// values. Throws rpa::Error.
RPA_EXPORT void StaticValidateInputs(const TensorView& q, const TensorView& kv_pages,
                                     const PageTable& page_table, const AttentionOptions& options);
RPA_EXPORT void StaticValidateInputs(const TensorView& q, const KVPages& kv,
                                     const PageTable& page_table, const AttentionOptions& options);

// The static checks, then the metadata's values: num_seqs, kv_lens,
// cu_q_lens, and every page index that will be read. O(num_seqs + pages read).
RPA_EXPORT void DynamicValidateInputs(const TensorView& q, const TensorView& kv_pages,
                                      const PageTable& page_table, const AttentionOptions& options);
RPA_EXPORT void DynamicValidateInputs(const TensorView& q, const KVPages& kv,
                                      const PageTable& page_table, const AttentionOptions& options);

}  // namespace rpa

#endif  // RPA_VALIDATE_H_
