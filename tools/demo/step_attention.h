// Attention for all layers of one step: the call a model makes once per
// layer, with the step's page table shared by all of them.
#ifndef RPA_TOOLS_DEMO_STEP_ATTENTION_H_
#define RPA_TOOLS_DEMO_STEP_ATTENTION_H_

#include "demo/layer_caches.h"
#include "demo/step_batch.h"
#include "rpa/options.h"

namespace rpa::tools {

// Plans the step once (AttentionPlan), then for every layer writes the
// step's new K/V rows into the layer's cache pages and attends
// (AttentionPlan::RunWithKVWrite), into batch.Out(layer).
void RunStepAttention(StepBatch& batch, LayerCaches& caches, const AttentionOptions& options);

}  // namespace rpa::tools

#endif  // RPA_TOOLS_DEMO_STEP_ATTENTION_H_
