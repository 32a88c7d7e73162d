// The size of one worker's scratch, the one piece of the kernel's scratch
// layout that block-size selection (block_sizes.cc) needs: the fit into
// vmem_limit_bytes shrinks tiles until this fits. Here, below both the plan
// and block_sizes.cc, so that neither includes the other's header.
//
// Defined in plan.cc for now; the scratch layout itself (LayoutScratch in
// compute.cc) is to move beside it (issue 14), so that the bytes counted here
// are the bytes the run allocates.
#ifndef RPA_SRC_SCRATCH_H_
#define RPA_SRC_SCRATCH_H_

#include <cstdint>

#include "problem.h"

namespace rpa::internal {

// Bytes of one worker's scratch for tiles of q_tile query tokens and
// kv_block keys, from the problem's num_q_heads, num_kv_heads, head_dim and
// kv_dtype.
int64_t ScratchBytes(const AttentionProblem& problem, int64_t q_tile, int64_t kv_block);

}  // namespace rpa::internal

#endif  // RPA_SRC_SCRATCH_H_
