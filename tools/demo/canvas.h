// An RGB raster with the few drawing operations a chart needs; y grows down.
#ifndef RPA_TOOLS_DEMO_CANVAS_H_
#define RPA_TOOLS_DEMO_CANVAS_H_

#include <cstdint>
#include <string_view>
#include <vector>

namespace rpa::tools {

struct Color {
  uint8_t r = 0, g = 0, b = 0;
};

class Canvas {
 public:
  Canvas(int width, int height, Color background);

  int width() const { return width_; }
  int height() const { return height_; }
  const std::vector<uint8_t>& rgb() const { return rgb_; }

  void Set(int x, int y, Color c);  // Outside the canvas: ignored.
  // Pixels [x0, x1) x [y0, y1).
  void FillRect(int x0, int y0, int x1, int y1, Color c);
  void Line(int x0, int y0, int x1, int y1, Color c);  // Both ends included.
  // Text with its top-left corner at (x, y), each font pixel scale x scale.
  void Text(int x, int y, std::string_view text, int scale, Color c);
  static int TextWidth(std::string_view text, int scale);

 private:
  int width_, height_;
  std::vector<uint8_t> rgb_;
};

}  // namespace rpa::tools

#endif  // RPA_TOOLS_DEMO_CANVAS_H_
