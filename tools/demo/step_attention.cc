#include "demo/step_attention.h"

#include "rpa/plan.h"

namespace rpa::tools {

void RunStepAttention(StepBatch& batch, LayerCaches& caches, const AttentionOptions& options) {
  // One plan per step (validation, block sizes, tasks) from the step's page
  // table, run by every layer: the layers share the metadata and shapes.
  // thread_local: the plan's storage is reused step after step.
  thread_local AttentionPlan plan;
  const TensorView cache0 = caches.Layer(0);
  plan.Plan(ShapeOf(batch.Q(0), cache0), batch.Table(), options);
  for (int layer = 0; layer < batch.shape().layers; ++layer) {
    plan.RunWithKVWrite(batch.Q(layer), batch.NewK(layer), batch.NewV(layer), caches.Layer(layer),
                        batch.Out(layer));
  }
}

}  // namespace rpa::tools
