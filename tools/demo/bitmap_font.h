// A 5x7 pixel font (the HD44780's shapes) for the plot's labels: capitals,
// digits and the punctuation the labels use; other characters draw blank.
#ifndef RPA_TOOLS_DEMO_BITMAP_FONT_H_
#define RPA_TOOLS_DEMO_BITMAP_FONT_H_

#include <array>
#include <cstdint>

namespace rpa::tools {

inline constexpr int kGlyphWidth = 5;
inline constexpr int kGlyphHeight = 7;

// Row y's pixels in bits 4 (left) .. 0 (right). Lower case maps to capitals.
std::array<uint8_t, kGlyphHeight> Glyph(char c);

}  // namespace rpa::tools

#endif  // RPA_TOOLS_DEMO_BITMAP_FONT_H_
