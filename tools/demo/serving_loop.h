// The demo's serving loop: requests arrive, are prefilled in chunks, decode
// and finish; each step schedules its tokens, builds its page table once,
// runs attention (with the K/V write) for every layer, and some steps are
// checked against the reference.
#ifndef RPA_TOOLS_DEMO_SERVING_LOOP_H_
#define RPA_TOOLS_DEMO_SERVING_LOOP_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "demo/model_shape.h"
#include "demo/request_stream.h"
#include "demo/sampled_check.h"
#include "demo/scheduler.h"
#include "demo/step_plot.h"
#include "rpa/options.h"
#include "testing/workloads.h"

namespace rpa::tools {

struct LoopConfig {
  ModelShape shape;
  StreamSpec stream;
  SchedulerLimits limits;
  int32_t num_pages = 1024;     // Per layer.
  int64_t max_steps = 0;        // 0: until every request has finished.
  int check_every = 40;         // Check steps 0, check_every, ... and the last of max_steps.
  int32_t check_rows = 4;       // Rows at each end of each sequence (sampled_check.h).
  AttentionOptions options;
  uint64_t seed = 2026;
};

struct StepRecord {
  StepPoint point;
  testing::WorkCount work;  // All layers.
  SampledCheck check;       // When point.checked.
};

// What the progress line shows after each step.
struct LoopProgress {
  int64_t step = 0;
  int running = 0, waiting = 0, finished = 0, requests = 0;
  int32_t free_pages = 0, num_pages = 0;
  const StepRecord* last = nullptr;
};

struct LoopResult {
  std::vector<StepRecord> steps;
  int requests = 0, finished = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double seconds = 0;  // Attention of every step, all layers.
  int checks = 0;
  int64_t checked_rows = 0;
  double worst_ratio = 0;  // NaN if a check saw NaN.
  bool Passed() const { return checks > 0 && worst_ratio <= 1.0; }
};

LoopResult RunServingLoop(const LoopConfig& config,
                          const std::function<void(const LoopProgress&)>& progress);

}  // namespace rpa::tools

#endif  // RPA_TOOLS_DEMO_SERVING_LOOP_H_
