// The one error type: every rejected input raises it before anything is
// written, with JAX's wording where JAX has a message and a second sentence
// that says how to fix the input.
#ifndef RPA_ERROR_H_
#define RPA_ERROR_H_

#include <stdexcept>
#include <string>
#include <string_view>

#include "rpa/export.h"

namespace rpa {

enum class ErrorKind {
  kShape,       // A tensor's rank or extents do not fit the others.
  kDtype,       // A tensor's element type is not supported there.
  kLayout,      // A view's innermost dimension is not contiguous.
  kOption,      // A scalar option is out of its domain.
  kBlockSize,   // num_kv_pages_per_block / num_queries_per_block.
  kMetadata,    // num_seqs, kv_lens, cu_q_lens values (dynamic checks).
  kPageIndex,   // A page index that would be read is outside the cache.
};

constexpr std::string_view ToString(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kShape: return "shape";
    case ErrorKind::kDtype: return "dtype";
    case ErrorKind::kLayout: return "layout";
    case ErrorKind::kOption: return "option";
    case ErrorKind::kBlockSize: return "block_size";
    case ErrorKind::kMetadata: return "metadata";
    case ErrorKind::kPageIndex: return "page_index";
  }
  return "unknown";
}

class RPA_EXPORT Error : public std::invalid_argument {
 public:
  Error(ErrorKind kind, const std::string& message)
      : std::invalid_argument(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

}  // namespace rpa

#endif  // RPA_ERROR_H_
