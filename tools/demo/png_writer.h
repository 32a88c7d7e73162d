// A minimal PNG encoder (8-bit RGB, no filtering, zlib's deflate): enough for
// the demo's plot without a plotting library.
#ifndef RPA_TOOLS_DEMO_PNG_WRITER_H_
#define RPA_TOOLS_DEMO_PNG_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace rpa::tools {

// rgb: height rows of width pixels, 3 bytes each. Returns the file's bytes.
std::vector<uint8_t> EncodePng(int width, int height, const std::vector<uint8_t>& rgb);

// Writes EncodePng's bytes to path; throws std::runtime_error naming the
// path when it cannot.
void WritePng(const std::string& path, int width, int height, const std::vector<uint8_t>& rgb);

}  // namespace rpa::tools

#endif  // RPA_TOOLS_DEMO_PNG_WRITER_H_
