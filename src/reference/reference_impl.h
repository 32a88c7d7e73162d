// The reference computation on a validated problem (see rpa/reference.h).
#ifndef RPA_SRC_REFERENCE_REFERENCE_IMPL_H_
#define RPA_SRC_REFERENCE_REFERENCE_IMPL_H_

#include "problem.h"

namespace rpa::internal {

// One sequence, token and head at a time; f64 accumulation; writes every
// row of problem.out, zeros for padding rows.
void ReferenceAttention(const AttentionProblem& problem);

}  // namespace rpa::internal

#endif  // RPA_SRC_REFERENCE_REFERENCE_IMPL_H_
