#include "demo/step_attention.h"

#include "rpa/kv_cache.h"

namespace rpa::tools {

void RunStepAttention(StepBatch& batch, LayerCaches& caches, const AttentionOptions& options) {
  const PageTable table = batch.Table();  // Built once per step, shared by every layer.
  // TODO(issue 17, plan/run API): plan once here, from `table`, the shapes
  // and `options` (validation, block sizes, the task plan), and run that
  // plan in the loop below; today every layer's call validates and plans
  // again the same metadata.
  for (int layer = 0; layer < batch.shape().layers; ++layer) {
    RaggedPagedAttentionWithKVWrite(batch.Q(layer), batch.NewK(layer), batch.NewV(layer),
                                    caches.Layer(layer), table, options, batch.Out(layer));
  }
}

}  // namespace rpa::tools
