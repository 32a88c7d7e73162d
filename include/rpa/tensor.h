// A non-owning, strided view of a tensor of up to four dimensions.
//
// Strides are in elements, as in PyTorch (NumPy's byte strides divided by the
// item size). Any stride is accepted except that the innermost dimension must
// be contiguous (stride 1): kernels load whole head_dim rows as vectors.
#ifndef RPA_TENSOR_H_
#define RPA_TENSOR_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "rpa/dtype.h"
#include "rpa/error.h"

namespace rpa {

inline constexpr int kMaxRank = 4;

// `Byte` is `const void` for inputs (TensorView) and `void` for outputs
// (MutableTensorView); a mutable view converts to a const one, never back.
template <typename Byte>
struct BasicTensorView {
  Byte* data = nullptr;
  DType dtype = DType::kF32;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> strides{};  // In elements.

  BasicTensorView() = default;

  // A row-major contiguous view.
  BasicTensorView(Byte* data_in, DType dtype_in, std::initializer_list<int64_t> shape_in)
      : data(data_in), dtype(dtype_in), rank(CheckedRank(shape_in.size())) {
    int d = 0;
    for (int64_t extent : shape_in) shape[d++] = extent;
    int64_t stride = 1;
    for (d = rank - 1; d >= 0; --d) {
      strides[d] = stride;
      stride *= shape[d];
    }
  }

  // A view with explicit strides (elements).
  BasicTensorView(Byte* data_in, DType dtype_in, std::initializer_list<int64_t> shape_in,
                  std::initializer_list<int64_t> strides_in)
      : data(data_in), dtype(dtype_in), rank(CheckedRank(shape_in.size())) {
    if (strides_in.size() != shape_in.size()) {
      throw Error(ErrorKind::kShape, "A TensorView needs one stride per dimension. Pass as many "
                                     "strides as extents.");
    }
    int d = 0;
    for (int64_t extent : shape_in) shape[d++] = extent;
    d = 0;
    for (int64_t stride : strides_in) strides[d++] = stride;
  }

  template <typename Other,
            typename = std::enable_if_t<std::is_const_v<Byte> && !std::is_const_v<Other>>>
  BasicTensorView(const BasicTensorView<Other>& other)  // NOLINT: intended implicit.
      : data(other.data), dtype(other.dtype), rank(other.rank), shape(other.shape),
        strides(other.strides) {}

  static int CheckedRank(size_t rank) {
    if (rank > kMaxRank) {
      throw Error(ErrorKind::kShape, "A TensorView has at most " + std::to_string(kMaxRank) +
                                         " dimensions; got " + std::to_string(rank) +
                                         ". Pass rpa's tensors with their documented rank.");
    }
    return static_cast<int>(rank);
  }

  int64_t NumElements() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= shape[d];
    return n;
  }

  // Python's spelling of the shape: "(8,)", "(2, 16)".
  std::string ShapeString() const {
    std::string s = "(";
    for (int d = 0; d < rank; ++d) {
      if (d > 0) s += ", ";
      s += std::to_string(shape[d]);
    }
    if (rank == 1) s += ",";
    return s + ")";
  }
};

using TensorView = BasicTensorView<const void>;
using MutableTensorView = BasicTensorView<void>;

}  // namespace rpa

#endif  // RPA_TENSOR_H_
