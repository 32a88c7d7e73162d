#include "demo/step_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace rpa::tools {
namespace {

constexpr int kWidth = 1000, kHeight = 620;
constexpr int kLeft = 90, kRight = 20;  // Plot area margins.
constexpr Color kWhite{255, 255, 255}, kInk{40, 40, 40}, kGrid{225, 225, 225};
constexpr Color kTime{30, 30, 30}, kChecked{0, 150, 60};
constexpr Color kPrefill{52, 101, 164}, kDecode{245, 121, 0};

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

// One panel's frame: [top, bottom) in y, a y axis from 0 to y_max.
struct Panel {
  int top, bottom;
  double y_max;
  int n;  // Steps along x.

  int X(double step) const {
    return kLeft + static_cast<int>(step * (kWidth - kLeft - kRight) / std::max(n, 1));
  }
  int Y(double v) const {
    return bottom - static_cast<int>(std::lround(v / y_max * (bottom - top)));
  }
};

void DrawAxes(Canvas& c, const Panel& p, const std::string& label) {
  for (double f : {0.25, 0.5, 0.75, 1.0}) {
    c.Line(kLeft, p.Y(f * p.y_max), kWidth - kRight, p.Y(f * p.y_max), kGrid);
  }
  for (double f : {0.0, 0.5, 1.0}) {
    const std::string text = Number(f * p.y_max);
    c.Text(kLeft - 8 - Canvas::TextWidth(text, 2), p.Y(f * p.y_max) - 7, text, 2, kInk);
  }
  c.Line(kLeft, p.top, kLeft, p.bottom, kInk);
  c.Line(kLeft, p.bottom, kWidth - kRight, p.bottom, kInk);
  c.Text(kLeft + 8, p.top - 22, label, 2, kInk);
}

void DrawStepTimes(Canvas& c, const Panel& p, const std::vector<StepPoint>& steps) {
  for (size_t i = 1; i < steps.size(); ++i) {
    c.Line(p.X(i - 0.5), p.Y(steps[i - 1].ms), p.X(i + 0.5), p.Y(steps[i].ms), kTime);
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!steps[i].checked) continue;
    const int x = p.X(i + 0.5), y = p.Y(steps[i].ms);
    c.FillRect(x - 3, y - 3, x + 4, y + 4, kChecked);
  }
}

void DrawTokens(Canvas& c, const Panel& p, const std::vector<StepPoint>& steps) {
  for (size_t i = 0; i < steps.size(); ++i) {
    const int x0 = p.X(static_cast<double>(i));
    const int x1 = std::max(p.X(i + 1.0), x0 + 1);
    const int decode_top = p.Y(steps[i].decode_tokens);
    c.FillRect(x0, decode_top, x1, p.bottom, kDecode);
    c.FillRect(x0, p.Y(steps[i].decode_tokens + steps[i].prefill_tokens), x1, decode_top,
               kPrefill);
  }
}

void DrawLegend(Canvas& c, int x, int y) {
  const struct {
    Color color;
    const char* text;
  } items[] = {{kPrefill, "prefill"}, {kDecode, "decode"}, {kChecked, "checked vs reference"}};
  for (const auto& item : items) {
    c.FillRect(x, y, x + 14, y + 14, item.color);
    c.Text(x + 20, y, item.text, 2, kInk);
    x += 20 + Canvas::TextWidth(item.text, 2) + 30;
  }
}

}  // namespace

Canvas DrawStepPlot(const std::vector<StepPoint>& steps, const std::string& title) {
  Canvas c(kWidth, kHeight, kWhite);
  c.Text(kLeft, 12, title, 2, kInk);
  double max_ms = 0, max_tokens = 0;
  for (const StepPoint& s : steps) {
    max_ms = std::max(max_ms, s.ms);
    max_tokens = std::max(max_tokens, static_cast<double>(s.prefill_tokens + s.decode_tokens));
  }
  const int n = static_cast<int>(steps.size());
  const Panel time{70, 290, NiceCeiling(max_ms), n};
  const Panel tokens{350, 550, NiceCeiling(max_tokens), n};
  DrawAxes(c, time, "step time (ms), all layers");
  DrawAxes(c, tokens, "tokens per step");
  DrawStepTimes(c, time, steps);
  DrawTokens(c, tokens, steps);
  for (double f : {0.0, 0.5, 1.0}) {
    const std::string text = Number(std::round(f * n));
    c.Text(tokens.X(f * n) - Canvas::TextWidth(text, 2) / 2, tokens.bottom + 8, text, 2, kInk);
  }
  c.Text(kWidth - kRight - Canvas::TextWidth("step", 2), tokens.bottom + 30, "step", 2, kInk);
  DrawLegend(c, kLeft, kHeight - 22);
  return c;
}

}  // namespace rpa::tools
