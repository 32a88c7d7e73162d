#include "demo/canvas.h"

#include <algorithm>
#include <cstdlib>

#include "demo/bitmap_font.h"

namespace rpa::tools {

Canvas::Canvas(int width, int height, Color background)
    : width_(width), height_(height), rgb_(static_cast<size_t>(width) * height * 3) {
  FillRect(0, 0, width, height, background);
}

void Canvas::Set(int x, int y, Color c) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  uint8_t* p = &rgb_[(static_cast<size_t>(y) * width_ + x) * 3];
  p[0] = c.r;
  p[1] = c.g;
  p[2] = c.b;
}

void Canvas::FillRect(int x0, int y0, int x1, int y1, Color c) {
  for (int y = std::max(y0, 0); y < std::min(y1, height_); ++y) {
    for (int x = std::max(x0, 0); x < std::min(x1, width_); ++x) Set(x, y, c);
  }
}

void Canvas::Line(int x0, int y0, int x1, int y1, Color c) {
  // Bresenham.
  const int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
  const int dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
  int error = dx + dy;
  for (;;) {
    Set(x0, y0, c);
    if (x0 == x1 && y0 == y1) return;
    const int e2 = 2 * error;
    if (e2 >= dy) {
      error += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      error += dx;
      y0 += sy;
    }
  }
}

void Canvas::Text(int x, int y, std::string_view text, int scale, Color c) {
  for (const char ch : text) {
    const std::array<uint8_t, kGlyphHeight> glyph = Glyph(ch);
    for (int row = 0; row < kGlyphHeight; ++row) {
      for (int col = 0; col < kGlyphWidth; ++col) {
        if ((glyph[row] >> (kGlyphWidth - 1 - col)) & 1) {
          FillRect(x + col * scale, y + row * scale, x + (col + 1) * scale, y + (row + 1) * scale,
                   c);
        }
      }
    }
    x += (kGlyphWidth + 1) * scale;
  }
}

int Canvas::TextWidth(std::string_view text, int scale) {
  return static_cast<int>(text.size()) * (kGlyphWidth + 1) * scale - scale;
}

}  // namespace rpa::tools
