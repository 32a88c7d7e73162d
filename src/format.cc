#include "format.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace rpa::internal {

std::string PyRepr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, as Python's repr; then Python's choice of
  // notation: scientific when the exponent is < -4 or >= 16.
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, result.ptr);
  const size_t e_pos = sci.find('e');
  const int exponent = std::atoi(sci.c_str() + e_pos + 1);
  if (exponent < -4 || exponent >= 16) return sci;  // "1e-05", "1.5e+16".

  const bool negative = sci[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e_pos; ++i) {
    if (sci[i] != '.') digits += sci[i];
  }
  std::string fixed;
  if (exponent < 0) {
    fixed = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  } else {
    const size_t int_digits = static_cast<size_t>(exponent) + 1;
    if (digits.size() <= int_digits) {
      fixed = digits + std::string(int_digits - digits.size(), '0') + ".0";
    } else {
      fixed = digits.substr(0, int_digits) + "." + digits.substr(int_digits);
    }
  }
  return negative ? "-" + fixed : fixed;
}

std::string PyRepr(DType dtype) { return StrCat("dtype('", ToString(dtype), "')"); }

void ThrowInvalid(ErrorKind kind, const std::string& message, std::string_view fix) {
  // Some of JAX's texts end without a period; the fix is a sentence of its own.
  const bool ends_sentence = !message.empty() && message.back() == '.';
  throw Error(kind, message + (ends_sentence ? " " : ". ") + std::string(fix));
}

}  // namespace rpa::internal
