// `rpa demo --plot FILE.png`: step time and tokens per step over the run,
// drawn with Cairo (antialiased lines and text) and written as PNG by it.
#ifndef RPA_TOOLS_DEMO_STEP_PLOT_H_
#define RPA_TOOLS_DEMO_STEP_PLOT_H_

#include <cairo.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rpa::tools {

struct StepPoint {
  double ms = 0;              // Attention for all layers of the step.
  int32_t prefill_tokens = 0;
  int32_t decode_tokens = 0;
  bool checked = false;       // Compared with the reference.
};

// The image's size in pixels and its two panels' rows [top, bottom) (y
// grows down): step time above, tokens per step below, the legend under both.
inline constexpr int kPlotWidth = 1000, kPlotHeight = 620;
inline constexpr int kTimePanelTop = 70, kTimePanelBottom = 290;
inline constexpr int kTokensPanelTop = 350, kTokensPanelBottom = 550;

struct SurfaceDeleter {
  void operator()(cairo_surface_t* surface) const { cairo_surface_destroy(surface); }
};
using Surface = std::unique_ptr<cairo_surface_t, SurfaceDeleter>;

// The two panels over the step index: step time (a line, checked steps
// marked) and tokens per step (prefill and decode stacked), on an opaque
// kPlotWidth x kPlotHeight image (CAIRO_FORMAT_RGB24).
Surface DrawStepPlot(const std::vector<StepPoint>& steps, const std::string& title);

// Writes the image as PNG; throws std::runtime_error naming the path and
// Cairo's reason when it cannot.
void WritePng(cairo_surface_t* image, const std::string& path);

}  // namespace rpa::tools

#endif  // RPA_TOOLS_DEMO_STEP_PLOT_H_
