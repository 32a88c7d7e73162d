#include "compute.h"

#include "reference_impl.h"

namespace rpa::internal {

// The simple correct path until the fast kernel replaces it.
void ComputeAttention(const AttentionProblem& problem) { ReferenceAttention(problem); }

}  // namespace rpa::internal
