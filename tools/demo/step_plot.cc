#include "demo/step_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <stdexcept>

namespace rpa::tools {
namespace {

constexpr double kLeft = 90, kRight = 20;  // Plot area margins.
constexpr double kFontSize = 14;

struct Color {
  double r, g, b;  // 0..255, as the legend's swatches are specified.
};
constexpr Color kWhite{255, 255, 255}, kInk{40, 40, 40}, kGrid{225, 225, 225};
constexpr Color kTime{30, 30, 30}, kChecked{0, 150, 60};
constexpr Color kPrefill{52, 101, 164}, kDecode{245, 121, 0};

void SetColor(cairo_t* cr, Color c) { cairo_set_source_rgb(cr, c.r / 255, c.g / 255, c.b / 255); }

// The smallest of 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k at or above v.
double NiceCeiling(double v) {
  if (!(v > 0)) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0}) {
    if (m * p >= v) return m * p;
  }
  return 10 * p;
}

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, v >= 10 || v == std::floor(v) ? "%.0f" : "%.1f", v);
  return buf;
}

// Where text goes relative to (x, y): its left end, its centre or its right
// end at x; y is the middle of its capitals.
enum class Align { kStart, kCenter, kEnd };

void Text(cairo_t* cr, double x, double y, const std::string& text, Align align) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, text.c_str(), &e);
  const double width = e.x_advance;
  const double left = align == Align::kStart ? x : align == Align::kCenter ? x - width / 2 : x - width;
  SetColor(cr, kInk);
  cairo_move_to(cr, left, y + kFontSize * 0.36);  // Baseline: half a capital's height below y.
  cairo_show_text(cr, text.c_str());
}

double TextWidth(cairo_t* cr, const std::string& text) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, text.c_str(), &e);
  return e.x_advance;
}

// One panel's frame: [top, bottom) in y, a y axis from 0 to y_max.
struct Panel {
  double top, bottom;
  double y_max;
  int n;  // Steps along x.

  double X(double step) const { return kLeft + step * (kPlotWidth - kLeft - kRight) / std::max(n, 1); }
  double Y(double v) const { return bottom - v / y_max * (bottom - top); }
};

// A one-pixel line on the pixel grid: through pixel centres, so it is sharp.
void HairLine(cairo_t* cr, double x0, double y0, double x1, double y1, Color c) {
  SetColor(cr, c);
  cairo_set_line_width(cr, 1);
  cairo_move_to(cr, std::floor(x0) + 0.5, std::floor(y0) + 0.5);
  cairo_line_to(cr, std::floor(x1) + 0.5, std::floor(y1) + 0.5);
  cairo_stroke(cr);
}

void DrawAxes(cairo_t* cr, const Panel& p, const std::string& label) {
  for (double f : {0.25, 0.5, 0.75, 1.0}) {
    HairLine(cr, kLeft, p.Y(f * p.y_max), kPlotWidth - kRight, p.Y(f * p.y_max), kGrid);
  }
  for (double f : {0.0, 0.5, 1.0}) Text(cr, kLeft - 8, p.Y(f * p.y_max), Number(f * p.y_max), Align::kEnd);
  HairLine(cr, kLeft, p.top, kLeft, p.bottom, kInk);
  HairLine(cr, kLeft, p.bottom, kPlotWidth - kRight, p.bottom, kInk);
  Text(cr, kLeft + 8, p.top - 15, label, Align::kStart);
}

void DrawStepTimes(cairo_t* cr, const Panel& p, const std::vector<StepPoint>& steps) {
  for (size_t i = 0; i < steps.size(); ++i) {
    const double x = p.X(i + 0.5), y = p.Y(steps[i].ms);
    i == 0 ? cairo_move_to(cr, x, y) : cairo_line_to(cr, x, y);
  }
  SetColor(cr, kTime);
  cairo_set_line_width(cr, 1.5);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  cairo_stroke(cr);
  SetColor(cr, kChecked);
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!steps[i].checked) continue;
    cairo_arc(cr, p.X(i + 0.5), p.Y(steps[i].ms), 4.5, 0, 2 * std::numbers::pi);
    cairo_fill(cr);
  }
}

// Bars on whole pixels: neighbouring steps meet without a seam.
void FillBar(cairo_t* cr, double x0, double x1, double y0, double y1, Color c) {
  SetColor(cr, c);
  const double left = std::round(x0), right = std::max(std::round(x1), left + 1);
  cairo_rectangle(cr, left, std::round(y0), right - left, std::round(y1) - std::round(y0));
  cairo_fill(cr);
}

void DrawTokens(cairo_t* cr, const Panel& p, const std::vector<StepPoint>& steps) {
  for (size_t i = 0; i < steps.size(); ++i) {
    const double x0 = p.X(static_cast<double>(i)), x1 = p.X(i + 1.0);
    const double decode_top = p.Y(steps[i].decode_tokens);
    FillBar(cr, x0, x1, decode_top, p.bottom, kDecode);
    FillBar(cr, x0, x1, p.Y(steps[i].decode_tokens + steps[i].prefill_tokens), decode_top, kPrefill);
  }
}

void DrawLegend(cairo_t* cr, double x, double y) {
  const struct {
    Color color;
    const char* text;
  } items[] = {{kPrefill, "prefill"}, {kDecode, "decode"}, {kChecked, "checked vs reference"}};
  for (const auto& item : items) {
    SetColor(cr, item.color);
    cairo_rectangle(cr, x, y, 14, 14);
    cairo_fill(cr);
    Text(cr, x + 20, y + 7, item.text, Align::kStart);
    x += 20 + TextWidth(cr, item.text) + 30;
  }
}

}  // namespace

Surface DrawStepPlot(const std::vector<StepPoint>& steps, const std::string& title) {
  Surface image(cairo_image_surface_create(CAIRO_FORMAT_RGB24, kPlotWidth, kPlotHeight));
  cairo_t* cr = cairo_create(image.get());
  SetColor(cr, kWhite);
  cairo_paint(cr);
  cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, kFontSize);
  Text(cr, kLeft, 20, title, Align::kStart);
  double max_ms = 0, max_tokens = 0;
  for (const StepPoint& s : steps) {
    max_ms = std::max(max_ms, s.ms);
    max_tokens = std::max(max_tokens, static_cast<double>(s.prefill_tokens + s.decode_tokens));
  }
  const int n = static_cast<int>(steps.size());
  const Panel time{kTimePanelTop, kTimePanelBottom, NiceCeiling(max_ms), n};
  const Panel tokens{kTokensPanelTop, kTokensPanelBottom, NiceCeiling(max_tokens), n};
  DrawAxes(cr, time, "step time (ms), all layers");
  DrawAxes(cr, tokens, "tokens per step");
  DrawStepTimes(cr, time, steps);
  DrawTokens(cr, tokens, steps);
  for (double f : {0.0, 0.5, 1.0}) {
    Text(cr, tokens.X(f * n), tokens.bottom + 15, Number(std::round(f * n)), Align::kCenter);
  }
  Text(cr, kPlotWidth - kRight, tokens.bottom + 37, "step", Align::kEnd);
  DrawLegend(cr, kLeft, kPlotHeight - 22);
  cairo_destroy(cr);
  cairo_surface_flush(image.get());
  return image;
}

void WritePng(cairo_surface_t* image, const std::string& path) {
  const cairo_status_t status = cairo_surface_write_to_png(image, path.c_str());
  if (status != CAIRO_STATUS_SUCCESS) {
    throw std::runtime_error("cannot write the plot to " + path + ": " +
                             cairo_status_to_string(status));
  }
}

}  // namespace rpa::tools
