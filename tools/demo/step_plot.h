// `rpa demo --plot FILE.png`: step time and tokens per step over the run.
#ifndef RPA_TOOLS_DEMO_STEP_PLOT_H_
#define RPA_TOOLS_DEMO_STEP_PLOT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "demo/canvas.h"

namespace rpa::tools {

struct StepPoint {
  double ms = 0;              // Attention for all layers of the step.
  int32_t prefill_tokens = 0;
  int32_t decode_tokens = 0;
  bool checked = false;       // Compared with the reference.
};

// Two panels over the step index: step time (a line, checked steps marked)
// and tokens per step (prefill and decode stacked).
Canvas DrawStepPlot(const std::vector<StepPoint>& steps, const std::string& title);

}  // namespace rpa::tools

#endif  // RPA_TOOLS_DEMO_STEP_PLOT_H_
