// One step's inputs, built once from the schedule and shared by every layer:
// the page table (JAX's kv_lens, page_indices, cu_q_lens, num_seqs, padded
// to the engine's fixed max_num_seqs and pages_per_seq, as a captured graph
// would keep them) and each layer's new q, k and v rows.
#ifndef RPA_TOOLS_DEMO_STEP_BATCH_H_
#define RPA_TOOLS_DEMO_STEP_BATCH_H_

#include <cstdint>
#include <vector>

#include "demo/activation_pool.h"
#include "demo/model_shape.h"
#include "demo/scheduler.h"
#include "rpa/page_table.h"
#include "rpa/tensor.h"

namespace rpa::tools {

struct StepBatchSize {
  int32_t max_num_batched_tokens = 512;  // The token budget.
  int32_t max_num_seqs = 24;
  int32_t pages_per_seq = 1;
};

class StepBatch {
 public:
  StepBatch(const ModelShape& shape, const StepBatchSize& size);

  // Fills the page table and every layer's rows for `schedule`. Rows past
  // the step's tokens keep an earlier step's rows (padding: attention reads
  // none of them and writes zeros to their outputs); table slots past its
  // sequences are empty, their pages 0 (vLLM's padding).
  void Build(const StepSchedule& schedule, const ActivationPool& activations);

  PageTable Table() const;
  TensorView Q(int layer) const;
  TensorView NewK(int layer) const;
  TensorView NewV(int layer) const;
  MutableTensorView Out(int layer);
  TensorView Out(int layer) const;
  const ModelShape& shape() const { return shape_; }

 private:
  ModelShape shape_;
  StepBatchSize size_;
  std::vector<int32_t> kv_lens_, page_indices_, cu_q_lens_, num_seqs_;
  // Per layer: [max_num_batched_tokens, heads, head_dim].
  std::vector<std::vector<uint8_t>> q_, new_k_, new_v_, out_;
};

}  // namespace rpa::tools

#endif  // RPA_TOOLS_DEMO_STEP_BATCH_H_
