// Message building for validation: Python's spelling of values, so that an
// rpa message reads exactly like JAX's f-string `{name=}` output, and the one
// check macro through which every rejected input is reported.
#ifndef RPA_SRC_FORMAT_H_
#define RPA_SRC_FORMAT_H_

#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

#include "rpa/dtype.h"
#include "rpa/error.h"

namespace rpa::internal {

// repr() of a Python float: "0.0", "1.5", "1e-05", "inf", "nan".
std::string PyRepr(double value);
inline std::string PyRepr(int64_t value) { return std::to_string(value); }
inline std::string PyRepr(int value) { return std::to_string(value); }
// repr() of a NumPy dtype: "dtype('int64')".
std::string PyRepr(DType dtype);
inline std::string PyRepr(const std::string& s) { return s; }
inline std::string PyRepr(std::string_view s) { return std::string(s); }
inline std::string PyRepr(const char* s) { return s; }

// Concatenates the Python spelling of each argument.
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::string out;
  ((out += PyRepr(args)), ...);
  return out;
}

// `name=value`, as Python's f"{name=}" prints it.
template <typename T>
std::string NameEq(std::string_view name, const T& value) {
  return StrCat(name, "=", value);
}

// Throws rpa::Error whose text is `message` and then `fix`, the sentence
// that says how to repair the input.
[[noreturn]] void ThrowInvalid(ErrorKind kind, const std::string& message, std::string_view fix);

}  // namespace rpa::internal

// The one way validation rejects an input. `message` is evaluated only on
// failure, so building it costs nothing on the success path.
#define RPA_CHECK(condition, kind, message, fix)                            \
  do {                                                                      \
    if (!(condition)) ::rpa::internal::ThrowInvalid((kind), (message), (fix)); \
  } while (0)

#endif  // RPA_SRC_FORMAT_H_
