// rpa._rpa: the pybind11 binding under the pure-Python API in rpa/_api.py.
//
// Every array argument becomes an rpa::TensorView over the caller's own memory
// when its layout allows, without a copy:
//   - objects with the buffer protocol (NumPy arrays, memoryviews) through
//     PyObject_GetBuffer, byte strides divided by the item size;
//   - everything else with __dlpack__ (torch tensors, JAX CPU arrays) through
//     a DLPack capsule, whose strides are already in elements.
// A layout rpa cannot read through strides (innermost dimension not
// contiguous, negative strides, byte strides that are not whole elements,
// a misaligned pointer, non-native byte order) is copied into a contiguous
// array first: nothing is ever misread. Every check of shapes, dtypes and
// values is the C++ library's; its rpa::Error arrives in Python as rpa.Error,
// a ValueError subclass with the message verbatim and a `kind` attribute.
// The GIL is released while the library validates and computes.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "rpa/rpa.h"
#include "rpa/threads.h"
#include "rpa/block_sizes.h"

namespace py = pybind11;

namespace rpa_python {
namespace {

// ---- DLPack: the ABI-stable structs of dlpack.h (v0.6 and later) that a
// legacy "dltensor" capsule holds. Only what we read is named.
namespace dlpack {
constexpr int32_t kCPU = 1;
enum TypeCode : uint8_t {
  kInt = 0,
  kUInt = 1,
  kFloat = 2,
  kBfloat = 4,
  kFloat8E4M3FN = 10,  // DLPack 1.1.
  kFloat8E5M2 = 12,
};
struct Device {
  int32_t device_type;
  int32_t device_id;
};
struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // In elements; null means row-major contiguous.
  uint64_t byte_offset;
};
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};
}  // namespace dlpack

// The DTypes rpa can name; everything else is rejected here with the same
// wording the library uses, since the library cannot represent it.
std::optional<rpa::DType> DTypeFromDlpack(const dlpack::DataType& t) {
  if (t.lanes != 1) return std::nullopt;
  switch (t.code) {
    case dlpack::kFloat:
      if (t.bits == 32) return rpa::DType::kF32;
      if (t.bits == 16) return rpa::DType::kF16;
      if (t.bits == 64) return rpa::DType::kF64;
      return std::nullopt;
    case dlpack::kBfloat:
      if (t.bits == 16) return rpa::DType::kBF16;
      return std::nullopt;
    case dlpack::kInt:
      if (t.bits == 8) return rpa::DType::kI8;
      if (t.bits == 32) return rpa::DType::kI32;
      if (t.bits == 64) return rpa::DType::kI64;
      return std::nullopt;
    case dlpack::kUInt:
      if (t.bits == 8) return rpa::DType::kU8;
      return std::nullopt;
    case dlpack::kFloat8E4M3FN:
      if (t.bits == 8) return rpa::DType::kF8E4M3FN;
      return std::nullopt;
    case dlpack::kFloat8E5M2:
      if (t.bits == 8) return rpa::DType::kF8E5M2;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

// A PEP 3118 format string ("f", "<e", "=i", "l", ...) of `itemsize` bytes.
// Sets `native` to false for a big-endian format.
std::optional<rpa::DType> DTypeFromFormat(const char* format, Py_ssize_t itemsize,
                                          bool& native) {
  native = true;
  std::string f = format ? format : "B";
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f = f.substr(1);
  else if (!f.empty() && (f[0] == '>' || f[0] == '!')) {
    native = false;
    f = f.substr(1);
  }
  if (f.size() != 1) return std::nullopt;
  switch (f[0]) {
    case 'f': return itemsize == 4 ? std::optional(rpa::DType::kF32) : std::nullopt;
    case 'd': return itemsize == 8 ? std::optional(rpa::DType::kF64) : std::nullopt;
    case 'e': return itemsize == 2 ? std::optional(rpa::DType::kF16) : std::nullopt;
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n':
      if (itemsize == 1) return rpa::DType::kI8;
      if (itemsize == 4) return rpa::DType::kI32;
      if (itemsize == 8) return rpa::DType::kI64;
      return std::nullopt;
    case 'B': case 'c':
      return itemsize == 1 ? std::optional(rpa::DType::kU8) : std::nullopt;
    default:
      return std::nullopt;
  }
}

std::string Repr(py::handle obj) { return py::repr(obj).cast<std::string>(); }

// repr() of the argument's dtype, for dtypes rpa cannot name.
std::string DtypeRepr(py::handle obj, const std::string& fallback) {
  if (py::hasattr(obj, "dtype")) return Repr(obj.attr("dtype"));
  return fallback;
}

[[noreturn]] void ThrowValue(rpa::ErrorKind kind, const std::string& message);

// A dtype that rpa::DType cannot even name (int16, bool, complex, ...), in
// the library's wording for dtypes it can name but does not support.
[[noreturn]] void ThrowUnsupportedDtype(const std::string& name, const std::string& dtype_repr) {
  std::string allowed = "int32";
  if (name == "q" || name == "out" || name == "out_a" || name == "out_b" || name == "q_nope" ||
      name == "q_pe") {
    allowed = "float32, bfloat16, float16";
  }
  if (name == "kv_pages" || name == "k_pages" || name == "v_pages" || name == "new_k" ||
      name == "new_v" || name == "ckv_cache" || name == "kpe_cache") {
    allowed = "float32, bfloat16, float16, float8_e4m3fn, float8_e5m2, int8";
  }
  if (name == "sinks" || name == "lse" || name == "lse_a" || name == "lse_b") allowed = "float32";
  if (name == "x") allowed = "float32, bfloat16, float16, float64";
  if (name == "codes") allowed = "uint8, int8";
  ThrowValue(rpa::ErrorKind::kDtype, name + ".dtype=" + dtype_repr + " is not supported; " +
                                         name + " must be one of " + allowed + ". Cast " + name +
                                         " to one of these dtypes.");
}

bool HasBuffer(py::handle obj) { return PyObject_CheckBuffer(obj.ptr()) != 0; }
bool HasDlpack(py::handle obj) { return py::hasattr(obj, "__dlpack__"); }

struct BufferRelease {
  void operator()(Py_buffer* buffer) const {
    PyBuffer_Release(buffer);
    delete buffer;
  }
};

// One array argument as an rpa view, plus what keeps its memory alive (the
// object, its Py_buffer or its DLPack capsule) until the call returns.
class Array {
 public:
  // `name` is the API's argument name. `writable`: the view is an output.
  static Array Open(py::handle obj, const std::string& name, bool writable);

  const rpa::MutableTensorView& view() const { return view_; }
  rpa::TensorView const_view() const { return view_; }
  bool copied() const { return copied_; }
  const py::object& owner() const { return owner_; }

  // Reads the array as `as` (kv_dtype=): the bytes of a uint8 array as
  // float8_e4m3fn, float8_e5m2 or int8 codes, zero-copy (one-byte elements,
  // so the strides stay valid). `as` equal to the array's own dtype, or none,
  // changes nothing. `keyword` names the argument that asked, for messages.
  void Reinterpret(std::optional<rpa::DType> as, const std::string& name,
                   const std::string& keyword);

  // [lowest, highest] byte address the view can touch; empty views touch none.
  std::pair<uintptr_t, uintptr_t> Extent() const {
    if (view_.data == nullptr) return {1, 0};  // Not given (e.g. v_pages of kv_pages).
    const auto base = reinterpret_cast<uintptr_t>(view_.data);
    uintptr_t lo = base, hi = base;
    const size_t item = rpa::SizeOf(view_.dtype);
    for (int d = 0; d < view_.rank; ++d) {
      if (view_.shape[d] == 0) return {1, 0};
      hi += static_cast<uintptr_t>((view_.shape[d] - 1) * view_.strides[d]) * item;
    }
    return {lo, hi + item - 1};
  }

 private:
  // Describes `obj` without copying; false when its layout needs a copy.
  bool Describe(py::handle obj, const std::string& name, bool writable);
  bool DescribeBuffer(py::handle obj, const std::string& name, bool writable);
  bool DescribeDlpack(py::handle obj, const std::string& name, bool writable);
  // Element strides from `shape` and `strides` (in units of `stride_unit`
  // bytes: 1 for the buffer protocol, the item size for DLPack); false when
  // rpa cannot read that layout through strides.
  bool SetLayout(int rank, const int64_t* shape, const int64_t* strides, int64_t stride_unit,
                 bool writable, const std::string& name);

  rpa::MutableTensorView view_;
  py::object owner_;
  py::object capsule_;
  std::unique_ptr<Py_buffer, BufferRelease> buffer_;
  bool copied_ = false;
};

Array Array::Open(py::handle obj, const std::string& name, bool writable) {
  Array array;
  py::object source = py::reinterpret_borrow<py::object>(obj);
  // torch refuses to export a tensor that requires grad; reading it is fine.
  if (!HasBuffer(source) && py::hasattr(source, "requires_grad") &&
      source.attr("requires_grad").cast<bool>()) {
    source = source.attr("detach")();
  }
  if (array.Describe(source, name, writable)) {
    array.owner_ = source;
    return array;
  }
  // A layout rpa cannot read through strides: a contiguous, native copy.
  py::object copy;
  if (!HasBuffer(source) && py::hasattr(source, "contiguous")) {
    copy = source.attr("contiguous")();
    if (copy.is(source)) copy = source.attr("clone")();
  } else {
    // A fresh allocation: aligned, C-contiguous, native byte order.
    py::module_ np = py::module_::import("numpy");
    py::object arr = np.attr("asarray")(source);
    copy = np.attr("array")(arr, py::arg("dtype") = arr.attr("dtype").attr("newbyteorder")("="),
                            py::arg("order") = "C", py::arg("copy") = true);
  }
  Array copied;
  if (!copied.Describe(copy, name, /*writable=*/false)) {
    throw std::logic_error("rpa: a contiguous copy of " + name + " is still unreadable");
  }
  copied.owner_ = copy;
  copied.copied_ = true;
  return copied;
}

bool Array::Describe(py::handle obj, const std::string& name, bool writable) {
  if (HasBuffer(obj)) return DescribeBuffer(obj, name, writable);
  if (HasDlpack(obj)) return DescribeDlpack(obj, name, writable);
  ThrowValue(rpa::ErrorKind::kDtype,
             name + " must be a NumPy array or a torch tensor (anything with the buffer "
                    "protocol or __dlpack__). Got " + Repr(py::type::handle_of(obj)) +
                 ". Convert it with numpy.asarray(" + name + ").");
}

bool Array::DescribeBuffer(py::handle obj, const std::string& name, bool writable) {
  buffer_.reset(new Py_buffer());
  const int flags = PyBUF_RECORDS_RO | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), buffer_.get(), flags) != 0) {
    delete buffer_.release();  // Nothing acquired: PyBuffer_Release must not run.
    PyErr_Clear();
    Py_buffer probe;
    if (writable && PyObject_GetBuffer(obj.ptr(), &probe, PyBUF_RECORDS_RO) == 0) {
      PyBuffer_Release(&probe);  // Readable, so it was read-only.
      const bool optional_output = name == "out" || name == "lse";
      ThrowValue(rpa::ErrorKind::kLayout,
                 name + " is read-only" +
                     (optional_output ? ". Pass a writable array, or omit " + name + "."
                                      : ", and this call writes into it. Pass a writable "
                                        "array (a NumPy copy is)."));
    }
    PyErr_Clear();
    // NumPy refuses to export object (and a few other) dtypes.
    ThrowUnsupportedDtype(name, DtypeRepr(obj, Repr(py::type::handle_of(obj))));
  }
  const Py_buffer& b = *buffer_;
  bool native = true;
  const std::optional<rpa::DType> dtype = DTypeFromFormat(b.format, b.itemsize, native);
  if (!dtype) {
    ThrowUnsupportedDtype(name, DtypeRepr(obj, std::string("'") + (b.format ? b.format : "") +
                                                   "'"));
  }
  if (b.ndim > rpa::kMaxRank) {
    std::vector<int64_t> shape(b.shape, b.shape + b.ndim);
    std::string s = "(";
    for (size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
    ThrowValue(rpa::ErrorKind::kShape,
               name + ".shape=" + s + ") has " + std::to_string(b.ndim) +
                   " dimensions; rpa's arrays have at most 4. Check the argument order.");
  }
  view_.dtype = *dtype;
  view_.data = b.buf;
  int64_t shape[rpa::kMaxRank] = {};
  int64_t strides[rpa::kMaxRank] = {};
  for (int d = 0; d < b.ndim; ++d) {
    shape[d] = b.shape[d];
    strides[d] = b.strides ? b.strides[d] : 0;
  }
  if (!b.strides) {  // C-contiguous by the protocol's rules.
    int64_t stride = b.itemsize;
    for (int d = b.ndim - 1; d >= 0; --d) {
      strides[d] = stride;
      stride *= shape[d];
    }
  }
  const bool usable = native && SetLayout(b.ndim, shape, strides, /*stride_unit=*/1, writable, name);
  if (!usable) buffer_.reset();
  return usable;
}

bool Array::DescribeDlpack(py::handle obj, const std::string& name, bool writable) {
  capsule_ = obj.attr("__dlpack__")();
  auto* managed = static_cast<dlpack::ManagedTensor*>(
      PyCapsule_GetPointer(capsule_.ptr(), "dltensor"));
  if (!managed) throw py::error_already_set();
  const dlpack::Tensor& t = managed->dl_tensor;
  if (t.device.device_type != dlpack::kCPU) {
    const std::string device =
        py::hasattr(obj, "device") ? Repr(obj.attr("device"))
                                   : "DLPack device type " + std::to_string(t.device.device_type);
    ThrowValue(rpa::ErrorKind::kLayout, name + " is on device " + device +
                                            "; rpa computes on the CPU. Pass " + name +
                                            ".cpu() (and move the result back).");
  }
  const std::optional<rpa::DType> dtype = DTypeFromDlpack(t.dtype);
  if (!dtype) {
    ThrowUnsupportedDtype(name, DtypeRepr(obj, "<DLPack type code " +
                                                   std::to_string(t.dtype.code) + ", " +
                                                   std::to_string(t.dtype.bits) + " bits>"));
  }
  if (t.ndim > rpa::kMaxRank) {
    std::string s = "(";
    for (int d = 0; d < t.ndim; ++d) s += (d ? ", " : "") + std::to_string(t.shape[d]);
    ThrowValue(rpa::ErrorKind::kShape,
               name + ".shape=" + s + ") has " + std::to_string(t.ndim) +
                   " dimensions; rpa's arrays have at most 4. Check the argument order.");
  }
  view_.dtype = *dtype;
  view_.data = static_cast<char*>(t.data) + t.byte_offset;
  int64_t strides[rpa::kMaxRank] = {};
  if (t.strides) {
    std::copy(t.strides, t.strides + t.ndim, strides);
  } else {
    int64_t stride = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      strides[d] = stride;
      stride *= t.shape[d];
    }
  }
  const bool usable = SetLayout(t.ndim, t.shape, strides,
                                /*stride_unit=*/static_cast<int64_t>(rpa::SizeOf(*dtype)),
                                writable, name);
  if (!usable) capsule_ = py::object();
  return usable;
}

bool Array::SetLayout(int rank, const int64_t* shape, const int64_t* strides,
                      int64_t stride_unit, bool writable, const std::string& /*name*/) {
  const int64_t item = static_cast<int64_t>(rpa::SizeOf(view_.dtype));
  view_.rank = rank;
  bool empty = false;
  for (int d = 0; d < rank; ++d) {
    view_.shape[d] = shape[d];
    empty = empty || shape[d] == 0;
  }
  // Row-major strides for dimensions whose stride is never used (extent 1,
  // or an empty array), so that a view of them is always "contiguous".
  int64_t contiguous = 1;
  for (int d = rank - 1; d >= 0; --d) {
    const int64_t byte_stride = strides[d] * stride_unit;
    if (empty || shape[d] == 1) {
      view_.strides[d] = contiguous;
    } else {
      if (byte_stride % item != 0 || byte_stride < 0) return false;
      view_.strides[d] = byte_stride / item;
      // An output must not write one element through two indices.
      if (writable && view_.strides[d] == 0) return false;
    }
    contiguous *= std::max<int64_t>(shape[d], 1);
  }
  if (rank > 0 && view_.strides[rank - 1] != 1) return false;
  if (!empty && reinterpret_cast<uintptr_t>(view_.data) % static_cast<uintptr_t>(item) != 0) {
    return false;
  }
  return true;
}

// ---- Errors.

// rpa.Error: a ValueError carrying rpa::Error's message and kind.
py::handle error_type;

[[noreturn]] void ThrowValue(rpa::ErrorKind kind, const std::string& message) {
  throw rpa::Error(kind, message);
}

void TranslateErrors(std::exception_ptr exception) {
  try {
    if (exception) std::rethrow_exception(exception);
  } catch (const rpa::Error& e) {
    py::object value = error_type(e.what());
    value.attr("kind") = std::string(rpa::ToString(e.kind()));
    PyErr_SetObject(error_type.ptr(), value.ptr());
  }
}

// ---- Quantized dtypes by name (kv_dtype=, quantize's dtype).

bool IsQuantized(rpa::DType d) {
  return d == rpa::DType::kF8E4M3FN || d == rpa::DType::kF8E5M2 || d == rpa::DType::kI8;
}

// The DType a name (a str, or None) stands for. `any_kv`: every KV-cache
// dtype is accepted (kv_dtype= may name the cache's own dtype); otherwise only
// the quantized ones.
std::optional<rpa::DType> ParseDtypeName(py::handle value, const std::string& keyword,
                                         bool any_kv) {
  if (value.is_none()) return std::nullopt;
  if (!py::isinstance<py::str>(value)) {
    throw py::type_error(keyword + " must be a dtype name such as 'float8_e4m3fn'" +
                         (any_kv ? " or None" : "") + ". Got " + Repr(value) + ".");
  }
  const std::optional<rpa::DType> d = rpa::DTypeFromString(value.cast<std::string>());
  const bool kv = d && (IsQuantized(*d) || *d == rpa::DType::kF32 ||
                        *d == rpa::DType::kBF16 || *d == rpa::DType::kF16);
  if (!d || (any_kv ? !kv : !IsQuantized(*d))) {
    ThrowValue(rpa::ErrorKind::kDtype,
               keyword + "=" + Repr(value) + " is not supported; " + keyword +
                   " must be one of 'float8_e4m3fn', 'float8_e5m2', 'int8'" +
                   (any_kv ? " or None" : "") + ". Pass one of these names" +
                   (any_kv ? " (None reads the cache in its own dtype)." : "."));
  }
  return d;
}

void Array::Reinterpret(std::optional<rpa::DType> as, const std::string& name,
                        const std::string& keyword) {
  if (!as || view_.dtype == *as) return;
  if (view_.dtype != rpa::DType::kU8 || !IsQuantized(*as)) {
    ThrowValue(rpa::ErrorKind::kDtype,
               name + ".dtype=" + DtypeRepr(owner_, std::string(rpa::ToString(view_.dtype))) +
                   " cannot be read as " + keyword + "='" + std::string(rpa::ToString(*as)) +
                   "'; " + keyword + " reads the bytes of a uint8 array as " +
                   std::string(rpa::ToString(*as)) + " codes. Pass " + name +
                   " as uint8 (rpa.quantize makes such codes)" +
                   (keyword == "kv_dtype" ? ", or omit kv_dtype to use its own dtype." : "."));
  }
  view_.dtype = *as;
}

// ---- Python scalars to options, unchanged: ints stay int64, floats double.

std::optional<int64_t> OptionalInt(py::handle value, const char* name) {
  if (value.is_none()) return std::nullopt;
  if (PyFloat_Check(value.ptr()) || !PyIndex_Check(value.ptr())) {
    throw py::type_error(std::string(name) + " must be an int or None. Got " + Repr(value) +
                         " of type " + Repr(py::type::handle_of(value)) + ".");
  }
  int overflow = 0;
  py::object as_int = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!as_int) throw py::error_already_set();
  const long long v = PyLong_AsLongLongAndOverflow(as_int.ptr(), &overflow);
  if (overflow != 0) {
    throw py::value_error(std::string(name) + "=" + Repr(value) + " does not fit in int64.");
  }
  return static_cast<int64_t>(v);
}

std::optional<double> OptionalFloat(py::handle value, const char* name) {
  if (value.is_none()) return std::nullopt;
  if (!PyFloat_Check(value.ptr()) && !PyIndex_Check(value.ptr()) &&
      !py::hasattr(value, "__float__")) {
    throw py::type_error(std::string(name) + " must be a float or None. Got " + Repr(value) +
                         " of type " + Repr(py::type::handle_of(value)) + ".");
  }
  const double v = PyFloat_AsDouble(value.ptr());
  if (v == -1.0 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

std::optional<bool> OptionalBool(py::handle value, const char* name) {
  if (value.is_none()) return std::nullopt;
  if (!PyBool_Check(value.ptr())) {
    throw py::type_error(std::string(name) + " must be True, False or None. Got " + Repr(value) +
                         " of type " + Repr(py::type::handle_of(value)) + ".");
  }
  return value.ptr() == Py_True;
}

std::optional<int> OptionalThreads(py::handle value) {
  const std::optional<int64_t> n = OptionalInt(value, "num_threads");
  if (!n) return std::nullopt;
  // The library checks the value (num_threads=0 must be positive.); here
  // only that it fits its int.
  if (*n > 1 << 20 || *n < -(1 << 20)) {
    throw py::value_error("num_threads=" + std::to_string(*n) +
                          " is far beyond any core count. Pass None to use RPA_NUM_THREADS or "
                          "every core, or a thread count >= 1.");
  }
  return static_cast<int>(*n);
}

int64_t RequiredInt(py::handle value, const char* name) {
  const std::optional<int64_t> v = OptionalInt(value, name);
  if (!v) throw py::type_error(std::string(name) + " must be an int.");
  return *v;
}

// ---- Keywords: how rpa/_api.py hands a call's options to the binding.

// The keyword arguments of one binding call, each taken once by name (an
// absent one reads as None) and converted by the reader its type needs.
// rpa/_api.py forwards only names this file reads, so one left over when the
// call's keywords are read means the two files disagree: Done() raises
// TypeError rather than silently ignoring an option.
// `name` as an interned Python str, made once per name: a lookup by it is
// a hash already computed and, in CPython's dicts of interned keys, a
// pointer compare. The strs live as long as the process (the module is
// never unloaded); the GIL guards the cache.
PyObject* InternedName(const char* name) {
  static std::vector<std::pair<const char*, PyObject*>> names;
  for (const auto& [literal, str] : names) {
    if (literal == name) return str;
  }
  PyObject* str = PyUnicode_InternFromString(name);
  if (str == nullptr) throw py::error_already_set();
  names.emplace_back(name, str);
  return str;
}

class Keywords {
 public:
  explicit Keywords(const py::kwargs& kwargs) : kwargs_(kwargs) { taken_.reserve(24); }

  py::object Take(const char* name) {
    // Borrowed; null: absent.
    PyObject* value = PyDict_GetItemWithError(kwargs_.ptr(), InternedName(name));
    if (value == nullptr) {
      if (PyErr_Occurred()) throw py::error_already_set();
      return py::none();
    }
    taken_.push_back(name);
    return py::reinterpret_borrow<py::object>(value);
  }
  std::optional<int64_t> Int(const char* name) { return OptionalInt(Take(name), name); }
  int64_t Required(const char* name) { return RequiredInt(Take(name), name); }
  std::optional<double> Float(const char* name) { return OptionalFloat(Take(name), name); }
  std::optional<bool> Bool(const char* name) { return OptionalBool(Take(name), name); }
  std::optional<int> Threads() { return OptionalThreads(Take("num_threads")); }

  // After the last Take: `function` (the binding's name) took every keyword.
  // Each reader takes another name, so counting them is enough.
  void Done(const std::string& function) const {
    if (taken_.size() == static_cast<size_t>(PyDict_Size(kwargs_.ptr()))) return;
    for (const auto& item : kwargs_) {
      const std::string key = py::str(item.first).cast<std::string>();
      if (std::find(taken_.begin(), taken_.end(), key) == taken_.end()) {
        throw py::type_error("rpa._rpa." + function + "() got an unexpected keyword argument '" +
                             key + "' (rpa/_api.py and rpa_module.cc disagree).");
      }
    }
  }

 private:
  const py::kwargs& kwargs_;  // The call's; outlives this reader.
  std::vector<std::string_view> taken_;  // The names Take found.
};

// ---- AttentionOptions: the one place Python keywords become them.

// The arrays an AttentionOptions views: they must outlive the call.
struct OptionArrays {
  Array alibi_slopes, custom_mask, packed_custom_mask;
};

std::optional<rpa::TensorView> OptionalArray(py::handle value, const char* name, Array& array) {
  if (value.is_none()) return std::nullopt;
  array = Array::Open(value, name, false);
  return array.const_view();
}

// rpa.ragged_paged_attention's options that rpa::AttentionOptions holds
// (every one but sinks and lse, which the call opens with its arrays).
rpa::AttentionOptions ToOptions(Keywords& kw, OptionArrays& arrays) {
  rpa::AttentionOptions o;
  o.sm_scale = kw.Float("sm_scale").value_or(1.0);
  o.sliding_window = kw.Int("sliding_window");
  o.soft_cap = kw.Float("soft_cap");
  o.mask_value = kw.Float("mask_value");
  o.k_scale = kw.Float("k_scale");
  o.v_scale = kw.Float("v_scale");
  o.num_kv_pages_per_block = kw.Int("num_kv_pages_per_block");
  o.num_queries_per_block = kw.Int("num_queries_per_block");
  o.vmem_limit_bytes = kw.Int("vmem_limit_bytes");
  o.num_threads = kw.Threads();
  o.causal = kw.Bool("causal");
  o.alibi_slopes = OptionalArray(kw.Take("alibi_slopes"), "alibi_slopes", arrays.alibi_slopes);
  o.custom_mask = OptionalArray(kw.Take("custom_mask"), "custom_mask", arrays.custom_mask);
  o.packed_custom_mask = OptionalArray(kw.Take("packed_custom_mask"), "packed_custom_mask",
                                       arrays.packed_custom_mask);
  return o;
}

// `sinks` (or None) opened into `array`, as the library's optional view.
std::optional<rpa::TensorView> OpenSinks(py::handle sinks, Array& array) {
  if (sinks.is_none()) return std::nullopt;
  array = Array::Open(sinks, "sinks", false);
  return array.const_view();
}

// ---- The KV cache and the page table: the one place each is built.

std::optional<rpa::KVLayout> ToLayout(py::handle layout) {
  if (layout.is_none()) return std::nullopt;
  const std::string s = py::str(layout).cast<std::string>();
  if (py::isinstance<py::str>(layout) && s == "NHD") return rpa::KVLayout::kNHD;
  if (py::isinstance<py::str>(layout) && s == "HND") return rpa::KVLayout::kHND;
  ThrowValue(rpa::ErrorKind::kOption,
             "kv_layout=" + Repr(layout) +
                 " must be 'NHD' or 'HND'. 'NHD' is [num_pages, page_size, num_kv_heads, "
                 "head_dim] (vLLM, FlashInfer), 'HND' is [num_pages, num_kv_heads, page_size, "
                 "head_dim].");
}

// The layout of separate caches (NHD when not given); none for JAX's
// combined kv_pages (v is None), which takes no kv_layout.
std::optional<rpa::KVLayout> CacheLayout(py::handle layout, py::handle v) {
  std::optional<rpa::KVLayout> result = ToLayout(layout);
  const bool split = !v.is_none();
  if (split && !result) result = rpa::KVLayout::kNHD;
  if (!split && result) {
    ThrowValue(rpa::ErrorKind::kOption,
               "kv_layout=" + Repr(layout) +
                   " applies to separate K and V caches only. Pass kv_pages=(k_pages, "
                   "v_pages), or omit kv_layout for JAX's combined kv_pages.");
  }
  return result;
}

// A cache as the library's overloads take it: JAX's one combined array, or
// separate K and V caches with their layout.
using CacheView = std::variant<rpa::TensorView, rpa::KVPages>;
using MutableCacheView = std::variant<rpa::MutableTensorView, rpa::MutableKVPages>;

// A read-only cache argument: `k` is kv_pages when `layout` is none, else
// k_pages beside v_pages.
struct CacheArrays {
  Array k, v;
  std::optional<rpa::KVLayout> layout;

  // `as`: read the cache's bytes as this dtype (kv_dtype=, Array::Reinterpret).
  static CacheArrays Open(py::handle k, py::handle v, std::optional<rpa::KVLayout> layout,
                          std::optional<rpa::DType> as) {
    CacheArrays c;
    c.layout = layout;
    const std::string k_name = layout ? "k_pages" : "kv_pages";
    c.k = Array::Open(k, k_name, false);
    c.k.Reinterpret(as, k_name, "kv_dtype");
    if (layout) {
      c.v = Array::Open(v, "v_pages", false);
      c.v.Reinterpret(as, "v_pages", "kv_dtype");
    }
    return c;
  }

  CacheView View() const {
    if (!layout) return k.const_view();
    return rpa::KVPages{k.const_view(), v.const_view(), *layout};
  }
};

// The four int32 arrays of a page table, opened under the API's names:
// JAX's, FlashInfer's CSR or its MLA table (the library's structs list
// their fields in these orders).
struct TableArrays {
  using Names = std::array<const char*, 4>;
  static constexpr Names kJax = {"kv_lens", "page_indices", "cu_q_lens", "num_seqs"};
  static constexpr Names kCsr = {"qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"};
  static constexpr Names kMla = {"qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr"};

  std::array<Array, 4> arrays;

  // `table`: rpa/_api.py's tuple of the four arrays, in `names`' order.
  static TableArrays Open(const py::tuple& table, const Names& names) {
    if (table.size() != names.size()) {
      throw std::logic_error("rpa: a page table is a tuple of 4 arrays");
    }
    TableArrays t;
    for (size_t i = 0; i < names.size(); ++i) t.arrays[i] = Array::Open(table[i], names[i], false);
    return t;
  }

  // rpa::PageTable, rpa::CsrPageTable or rpa::MlaPageTable of the arrays.
  template <typename Table>
  Table As() const {
    return Table{arrays[0].const_view(), arrays[1].const_view(), arrays[2].const_view(),
                 arrays[3].const_view()};
  }

  void AddTo(std::vector<const Array*>& inputs) const {
    for (const Array& a : arrays) inputs.push_back(&a);
  }
};

// What every ragged call opens besides its cache, in the order of their
// checks: the options, kv_dtype, kv_layout and q (Open), then, after the
// cache, the page table and sinks (OpenTable).
struct RaggedInputs {
  OptionArrays option_arrays;  // Viewed by `options`.
  rpa::AttentionOptions options;
  std::optional<rpa::DType> kv_dtype;   // The cache's bytes read as this (kv_dtype=).
  std::optional<rpa::KVLayout> layout;  // None: JAX's combined kv_pages.
  Array q, sinks;
  TableArrays table;

  // `v`: v_pages, or None for JAX's combined cache.
  static RaggedInputs Open(py::handle q, py::handle v, Keywords& kw) {
    RaggedInputs in;
    in.options = ToOptions(kw, in.option_arrays);
    in.kv_dtype = ParseDtypeName(kw.Take("kv_dtype"), "kv_dtype", /*any_kv=*/true);
    in.layout = CacheLayout(kw.Take("kv_layout"), v);
    in.q = Array::Open(q, "q", false);
    return in;
  }

  void OpenTable(const py::tuple& table_arrays, Keywords& kw) {
    table = TableArrays::Open(table_arrays, TableArrays::kJax);
    options.sinks = OpenSinks(kw.Take("sinks"), sinks);
  }

  rpa::PageTable Table() const { return table.As<rpa::PageTable>(); }

  // q, the page table and sinks: what an output must not overlap.
  std::vector<const Array*> Inputs() const {
    std::vector<const Array*> inputs = {&q, &sinks};
    table.AddTo(inputs);
    return inputs;
  }
};

// The output: `out` itself when rpa can write it in place (and it shares no
// memory with an input), else a contiguous scratch array copied into `out`
// only after the call succeeded, so a rejected call never touches it.
class Output {
 public:
  // `as`: read out's bytes as this dtype (Array::Reinterpret), `keyword`
  // the argument that asked for it.
  Output(py::handle out, const std::vector<const Array*>& inputs, const std::string& name = "out",
         std::optional<rpa::DType> as = std::nullopt, const std::string& keyword = "kv_dtype")
      : out_(out) {
    array_ = Array::Open(out, name, /*writable=*/true);
    bool overlaps = array_.copied();
    const auto [lo, hi] = array_.Extent();
    for (const Array* input : inputs) {
      const auto [in_lo, in_hi] = input->Extent();
      overlaps = overlaps || (lo <= hi && in_lo <= in_hi && lo <= in_hi && in_lo <= hi);
    }
    if (overlaps && !array_.copied()) {
      // Compute into scratch: a fresh contiguous array of out's kind.
      py::object scratch;
      if (!HasBuffer(out) && py::hasattr(out, "clone")) {
        scratch = out.attr("clone")(py::arg("memory_format") =
                                        py::module_::import("torch").attr("contiguous_format"));
      } else {
        py::module_ np = py::module_::import("numpy");
        scratch = np.attr("array")(out, py::arg("order") = "C");
      }
      array_ = Array::Open(scratch, name, true);
    }
    staged_ = overlaps || array_.copied();
    array_.Reinterpret(as, name, keyword);
  }
  const rpa::MutableTensorView& view() const { return array_.view(); }
  // What the library writes: `out` itself, or the scratch copy.
  const Array& array() const { return array_; }

  // After success: copy the scratch result into the caller's `out`.
  void Commit() {
    if (!staged_) return;
    if (!HasBuffer(out_) && py::hasattr(out_, "copy_")) {
      out_.attr("copy_")(array_.owner());
    } else {
      py::module_::import("numpy").attr("copyto")(out_, array_.owner());
    }
  }

 private:
  py::handle out_;
  Array array_;
  bool staged_ = false;
};

// out and, when given, lse (Outputs against the inputs), committed together.
struct RowOutputs {
  Output out;
  std::optional<Output> lse;

  RowOutputs(py::handle out_in, py::handle lse_in, const std::vector<const Array*>& inputs)
      : out(out_in, inputs) {
    if (!lse_in.is_none()) lse.emplace(lse_in, inputs, "lse");
  }
  std::optional<rpa::MutableTensorView> LseView() const {
    return lse ? std::optional<rpa::MutableTensorView>(lse->view()) : std::nullopt;
  }
  void Commit() {
    out.Commit();
    if (lse) lse->Commit();
  }
};

// rpa.ragged_paged_attention (reference: its oracle) into `out`.
py::object Ragged(bool reference, py::handle q, py::handle k, py::handle v,
                  const py::tuple& table, py::handle out, const py::kwargs& kwargs) {
  Keywords kw(kwargs);
  RaggedInputs in = RaggedInputs::Open(q, v, kw);
  const CacheArrays cache = CacheArrays::Open(k, v, in.layout, in.kv_dtype);
  in.OpenTable(table, kw);
  const py::object lse = kw.Take("lse");
  kw.Done("ragged");
  std::vector<const Array*> inputs = in.Inputs();
  inputs.insert(inputs.end(), {&cache.k, &cache.v});
  RowOutputs outputs(out, lse, inputs);
  in.options.lse = outputs.LseView();
  {
    py::gil_scoped_release release;
    std::visit(
        [&](const auto& kv) {
          if (reference) {
            rpa::RefRaggedPagedAttention(in.q.const_view(), kv, in.Table(), in.options,
                                         outputs.out.view());
          } else {
            rpa::RaggedPagedAttention(in.q.const_view(), kv, in.Table(), in.options,
                                      outputs.out.view());
          }
        },
        cache.View());
  }
  outputs.Commit();
  return py::reinterpret_borrow<py::object>(out);
}

// The static (and with `dynamic` the dynamic) checks of a ragged call.
void Validate(bool dynamic, py::handle q, py::handle k, py::handle v, const py::tuple& table,
              const py::kwargs& kwargs) {
  Keywords kw(kwargs);
  RaggedInputs in = RaggedInputs::Open(q, v, kw);
  const CacheArrays cache = CacheArrays::Open(k, v, in.layout, in.kv_dtype);
  in.OpenTable(table, kw);
  kw.Done("validate");
  py::gil_scoped_release release;
  std::visit(
      [&](const auto& kv) {
        if (dynamic) {
          rpa::DynamicValidateInputs(in.q.const_view(), kv, in.Table(), in.options);
        } else {
          rpa::StaticValidateInputs(in.q.const_view(), kv, in.Table(), in.options);
        }
      },
      cache.View());
}

// JAX's paged_attention (rpa.paged_attention) into `out`.
py::object Paged(py::handle q, py::handle k_pages, py::handle v_pages, py::handle lengths,
                 py::handle page_indices, py::handle out, const py::kwargs& kwargs) {
  Keywords kw(kwargs);
  rpa::PagedAttentionOptions options;
  options.mask_value = kw.Float("mask_value").value_or(rpa::kDefaultMaskValue);
  options.attn_logits_soft_cap = kw.Float("attn_logits_soft_cap");
  const std::optional<int64_t> block = kw.Int("pages_per_compute_block");
  if (!block) {
    throw py::type_error("pages_per_compute_block must be an int (JAX requires it too).");
  }
  options.pages_per_compute_block = *block;
  const py::object megacore_mode = kw.Take("megacore_mode");
  if (!megacore_mode.is_none()) options.megacore_mode = py::str(megacore_mode).cast<std::string>();
  options.inline_seq_dim = kw.Bool("inline_seq_dim").value_or(true);
  options.num_threads = kw.Threads();
  const std::optional<rpa::DType> as =
      ParseDtypeName(kw.Take("kv_dtype"), "kv_dtype", /*any_kv=*/true);
  kw.Done("paged");

  const Array aq = Array::Open(q, "q", false);
  Array ak = Array::Open(k_pages, "k_pages", false);
  ak.Reinterpret(as, "k_pages", "kv_dtype");
  Array av = Array::Open(v_pages, "v_pages", false);
  av.Reinterpret(as, "v_pages", "kv_dtype");
  const Array al = Array::Open(lengths, "lengths", false);
  const Array ap = Array::Open(page_indices, "page_indices", false);
  Output output(out, {&aq, &ak, &av, &al, &ap});
  {
    py::gil_scoped_release release;
    rpa::PagedAttention(aq.const_view(), ak.const_view(), av.const_view(), al.const_view(),
                        ap.const_view(), options, output.view());
  }
  output.Commit();
  return py::reinterpret_borrow<py::object>(out);
}

// The fused KV write: `k` (and `v` for separate caches) are written in place
// when rpa can write them through strides and they share no memory with an
// input; otherwise into a copy that is copied back after success. Either way
// a rejected call leaves them untouched (the library validates first).
// The new rows come first, then what Ragged takes.
py::object RaggedWithKVWrite(py::handle new_k, py::handle new_v, py::handle q, py::handle k,
                             py::handle v, const py::tuple& table, py::handle out,
                             const py::kwargs& kwargs) {
  Keywords kw(kwargs);
  RaggedInputs in = RaggedInputs::Open(q, v, kw);
  const Array ank = Array::Open(new_k, "new_k", false);
  const Array anv = Array::Open(new_v, "new_v", false);
  in.OpenTable(table, kw);
  const py::object lse = kw.Take("lse");
  kw.Done("ragged_kv_write");
  std::vector<const Array*> inputs = in.Inputs();
  inputs.insert(inputs.end(), {&ank, &anv});
  // K and V of one combined array may interleave (strided views of it): each
  // is checked against the inputs only, since the library never writes an
  // element of one through the other.
  Output k_cache(k, inputs, in.layout ? "k_pages" : "kv_pages", in.kv_dtype);
  std::optional<Output> v_cache;
  if (in.layout) v_cache.emplace(v, inputs, "v_pages", in.kv_dtype);
  inputs.push_back(&k_cache.array());
  if (v_cache) inputs.push_back(&v_cache->array());
  RowOutputs outputs(out, lse, inputs);
  in.options.lse = outputs.LseView();
  const MutableCacheView cache =
      v_cache ? MutableCacheView(rpa::MutableKVPages{k_cache.view(), v_cache->view(), *in.layout})
              : MutableCacheView(k_cache.view());
  {
    py::gil_scoped_release release;
    std::visit(
        [&](const auto& kv) {
          rpa::RaggedPagedAttentionWithKVWrite(in.q.const_view(), ank.const_view(),
                                               anv.const_view(), kv, in.Table(), in.options,
                                               outputs.out.view());
        },
        cache);
  }
  k_cache.Commit();
  if (v_cache) v_cache->Commit();
  outputs.Commit();
  return py::reinterpret_borrow<py::object>(out);
}

// rpa::MergeStates into the caller's `out` and `lse`.
// merge_states' lse_base: e (rpa's natural-log LSEs) or 2 (FlashInfer's).
rpa::LseBase ToLseBase(py::handle value) {
  const double base = OptionalFloat(value, "lse_base").value_or(M_E);
  if (base == M_E) return rpa::LseBase::kE;
  if (base == 2.0) return rpa::LseBase::k2;
  ThrowValue(rpa::ErrorKind::kOption,
             "lse_base=" + Repr(value) + " must be math.e or 2. rpa's LSEs (return_lse=True) are "
             "natural logs (math.e, the default); FlashInfer's are base 2.");
}

void Merge(py::handle out_a, py::handle lse_a, py::handle out_b, py::handle lse_b,
           py::handle out, py::handle lse, py::handle lse_base) {
  const rpa::LseBase base = ToLseBase(lse_base);
  const Array a = Array::Open(out_a, "out_a", false);
  const Array la = Array::Open(lse_a, "lse_a", false);
  const Array b = Array::Open(out_b, "out_b", false);
  const Array lb = Array::Open(lse_b, "lse_b", false);
  Output merged(out, {&a, &la, &b, &lb}, "out");
  Output merged_lse(lse, {&a, &la, &b, &lb}, "lse");
  {
    py::gil_scoped_release release;
    rpa::MergeStates(a.const_view(), la.const_view(), b.const_view(), lb.const_view(),
                     merged.view(), merged_lse.view(), base);
  }
  merged.Commit();
  merged_lse.Commit();
}

// Calls fn(offset_a, offset_b) for every index of `a`'s shape, with element
// offsets through a's and b's strides (b has a's shape).
template <typename Fn>
void ForEachElement(const rpa::TensorView& a, const rpa::TensorView& b, Fn fn) {
  int64_t shape[rpa::kMaxRank], sa[rpa::kMaxRank], sb[rpa::kMaxRank];
  const int pad = rpa::kMaxRank - a.rank;
  for (int d = 0; d < rpa::kMaxRank; ++d) {
    shape[d] = d < pad ? 1 : a.shape[d - pad];
    sa[d] = d < pad ? 0 : a.strides[d - pad];
    sb[d] = d < pad ? 0 : b.strides[d - pad];
  }
  for (int64_t i = 0; i < shape[0]; ++i) {
    for (int64_t j = 0; j < shape[1]; ++j) {
      for (int64_t k = 0; k < shape[2]; ++k) {
        for (int64_t l = 0; l < shape[3]; ++l) {
          fn(i * sa[0] + j * sa[1] + k * sa[2] + l * sa[3],
             i * sb[0] + j * sb[1] + k * sb[2] + l * sb[3]);
        }
      }
    }
  }
}

float CheckedScale(py::handle scale) {
  const std::optional<double> s = OptionalFloat(scale, "scale");
  if (s && !std::isfinite(*s)) {
    ThrowValue(rpa::ErrorKind::kOption,
               "scale=" + Repr(scale) + " must be finite. Pass a finite float for scale, or "
                                        "None to leave it out.");
  }
  return static_cast<float>(s.value_or(1.0));  // As the library uses k_scale / v_scale.
}

void CheckSameShape(const Array& x, const Array& out) {
  const rpa::MutableTensorView& a = x.view();
  const rpa::MutableTensorView& b = out.view();
  if (a.rank != b.rank || a.shape != b.shape) {
    throw std::logic_error("rpa: out of quantize/dequantize must have x's shape");
  }
}

// out = x / scale, rounded and saturated to `dtype` by rpa::StoreFromF32: the
// conversion the fused KV write uses, so the codes are the bytes it stores.
void Quantize(py::handle x, py::handle dtype, py::handle scale, py::handle out) {
  const rpa::DType to = *ParseDtypeName(dtype, "dtype", /*any_kv=*/false);
  const float s = CheckedScale(scale);
  const Array ax = Array::Open(x, "x", false);
  const rpa::DType from = ax.view().dtype;
  if (from != rpa::DType::kF32 && from != rpa::DType::kBF16 && from != rpa::DType::kF16 &&
      from != rpa::DType::kF64) {
    ThrowUnsupportedDtype("x", DtypeRepr(ax.owner(), std::string(rpa::ToString(from))));
  }
  Output codes(out, {&ax}, "out", to, "dtype");
  CheckSameShape(ax, codes.array());
  {
    py::gil_scoped_release release;
    const rpa::MutableTensorView& o = codes.view();
    ForEachElement(ax.const_view(), o, [&](int64_t i, int64_t j) {
      rpa::StoreFromF32(to, o.data, j, rpa::LoadAsF32(from, ax.view().data, i) / s);
    });
  }
  codes.Commit();
}

// out = f32(codes read as `dtype`) * scale, as the library reads K and V.
void Dequantize(py::handle codes, py::handle dtype, py::handle scale, py::handle out) {
  const std::optional<rpa::DType> as = ParseDtypeName(dtype, "dtype", /*any_kv=*/false);
  const float s = CheckedScale(scale);
  Array ac = Array::Open(codes, "codes", false);
  ac.Reinterpret(as, "codes", "dtype");
  Output values(out, {&ac}, "out");
  CheckSameShape(ac, values.array());
  {
    py::gil_scoped_release release;
    const rpa::MutableTensorView& o = values.view();
    const rpa::DType from = ac.view().dtype;
    ForEachElement(ac.const_view(), o, [&](int64_t i, int64_t j) {
      static_cast<float*>(o.data)[j] = rpa::LoadAsF32(from, ac.view().data, i) * s;
    });
  }
  values.Commit();
}

// ---- rpa::AttentionPlan (rpa.BatchAttention): plan once per step, run per layer.

rpa::DType DtypeByName(py::handle name, const std::string& keyword) {
  const std::string text = py::str(name).cast<std::string>();
  const std::optional<rpa::DType> dtype = rpa::DTypeFromString(text);
  if (!py::isinstance<py::str>(name) || !dtype) {
    ThrowValue(rpa::ErrorKind::kDtype, keyword + "=" + Repr(name) +
                                           " is not a dtype rpa knows. Pass a dtype or its "
                                           "name, such as 'bfloat16'.");
  }
  return *dtype;
}

// A thread-safe rpa::AttentionPlan: runs share it, a plan waits for them
// (the GIL is released while either waits or works).
class Plan {
 public:
  // form "jax": `table` is (kv_lens, page_indices, cu_q_lens, num_seqs);
  // "csr": (qo_indptr, kv_indptr, kv_indices, kv_last_page_len). The
  // keywords: the shape (Shape) and the options (Options).
  void PlanFrom(const std::string& form, const py::tuple& table, const py::kwargs& kwargs) {
    Keywords kw(kwargs);
    const rpa::AttentionShape shape = Shape(kw);
    OptionArrays option_arrays;
    const rpa::AttentionOptions options = Options(kw, option_arrays);
    kw.Done("AttentionPlan.plan");
    const bool csr = form == "csr";
    const TableArrays t = TableArrays::Open(table, csr ? TableArrays::kCsr : TableArrays::kJax);
    py::gil_scoped_release release;
    std::unique_lock lock(mutex_);
    if (csr) {
      plan_.Plan(shape, t.As<rpa::CsrPageTable>(), options);
    } else {
      plan_.Plan(shape, t.As<rpa::PageTable>(), options);
    }
  }

  // v is None for a combined cache. Keywords: sinks, lse, k_scale, v_scale
  // and kv_dtype, which names a float8 array's own dtype
  // (rpa._api._as_codes); without it a uint8 cache is read as the planned
  // quantized kv_dtype.
  py::object Run(py::handle q, py::handle k, py::handle v, py::handle out,
                 const py::kwargs& kwargs) {
    Keywords kw(kwargs);
    RunArrays a;
    a.q = Array::Open(q, "q", false);
    // Separate caches take the planned layout, set under the lock below.
    const std::optional<rpa::KVLayout> split =
        v.is_none() ? std::nullopt : std::optional(rpa::KVLayout::kNHD);
    a.cache = CacheArrays::Open(k, v, split, ReadCacheAs(kw.Take("kv_dtype")));
    rpa::RunExtras extras;
    extras.k_scale = kw.Float("k_scale");
    extras.v_scale = kw.Float("v_scale");
    extras.sinks = OpenSinks(kw.Take("sinks"), a.sinks);
    const py::object lse = kw.Take("lse");
    kw.Done("AttentionPlan.run");
    RowOutputs outputs(out, lse, {&a.q, &a.cache.k, &a.cache.v, &a.sinks});
    extras.lse = outputs.LseView();
    {
      py::gil_scoped_release release;
      std::shared_lock lock(mutex_);
      if (a.cache.layout) a.cache.layout = plan_.shape().kv_layout.value_or(rpa::KVLayout::kNHD);
      std::visit(
          [&](const auto& kv) { plan_.Run(a.q.const_view(), kv, outputs.out.view(), extras); },
          a.cache.View());
    }
    outputs.Commit();
    return py::reinterpret_borrow<py::object>(out);
  }

  py::dict Info() {
    py::gil_scoped_release release;
    std::shared_lock lock(mutex_);
    py::gil_scoped_acquire acquire;
    py::dict info;
    info["planned"] = plan_.planned();
    const rpa::AttentionShape s = plan_.shape();
    info["num_tokens"] = s.num_tokens;
    info["num_q_heads"] = s.num_q_heads;
    info["num_kv_heads"] = s.num_kv_heads;
    info["head_dim"] = s.head_dim;
    info["num_pages"] = s.num_pages;
    info["page_size"] = s.page_size;
    info["q_dtype"] = std::string(rpa::ToString(s.q_dtype));
    info["kv_dtype"] = std::string(rpa::ToString(s.kv_dtype));
    info["kv_layout"] = s.kv_layout ? py::object(py::str(std::string(rpa::ToString(*s.kv_layout))))
                                    : py::object(py::none());
    info["num_seqs"] = plan_.num_seqs();
    info["num_threads"] = plan_.num_threads();
    const rpa::BlockSizes b = plan_.block_sizes();
    info["num_kv_pages_per_block"] = b.num_kv_pages_per_block;
    info["num_queries_per_block"] = b.num_queries_per_block;
    info["kernels"] = plan_.DescribeKernels();
    return info;
  }

 private:
  struct RunArrays {
    Array q, sinks;
    CacheArrays cache;
  };

  static rpa::AttentionShape Shape(Keywords& kw) {
    const rpa::DType q_dtype = DtypeByName(kw.Take("q_dtype"), "q_dtype");
    const py::object kv_dtype = kw.Take("kv_dtype");
    return rpa::AttentionShape{kw.Int("num_tokens").value_or(-1),
                               kw.Required("num_q_heads"),
                               kw.Required("num_kv_heads"),
                               kw.Required("head_dim"),
                               kw.Required("num_pages"),
                               kw.Required("page_size"),
                               q_dtype,
                               kv_dtype.is_none() ? q_dtype : DtypeByName(kv_dtype, "kv_dtype"),
                               ToLayout(kw.Take("kv_layout"))};
  }

  // rpa.ragged_paged_attention's options plus FlashInfer's window_left.
  static rpa::AttentionOptions Options(Keywords& kw, OptionArrays& arrays) {
    rpa::AttentionOptions options = ToOptions(kw, arrays);
    const std::optional<int64_t> window_left = kw.Int("window_left");
    if (window_left) {
      if (options.sliding_window) {
        ThrowValue(rpa::ErrorKind::kOption,
                   "sliding_window=" + std::to_string(*options.sliding_window) +
                       " and window_left=" + std::to_string(*window_left) +
                       " are the same option. Pass one: sliding_window = window_left + 1.");
      }
      options.sliding_window = rpa::SlidingWindowFromWindowLeft(*window_left);
    }
    return options;
  }

  std::optional<rpa::DType> ReadCacheAs(py::handle kv_dtype) {
    if (!kv_dtype.is_none()) return ParseDtypeName(kv_dtype, "kv_dtype", /*any_kv=*/true);
    py::gil_scoped_release release;
    std::shared_lock lock(mutex_);
    const rpa::DType planned = plan_.shape().kv_dtype;
    return IsQuantized(planned) ? std::optional<rpa::DType>(planned) : std::nullopt;
  }

  rpa::AttentionPlan plan_;
  std::shared_mutex mutex_;
};

// ---- rpa::MlaPlan (rpa.BatchMLAAttention): FlashInfer's MLA plan / run.

// A thread-safe rpa::MlaPlan: runs share it, a plan waits for them (the GIL
// is released while either waits or works).
class MlaPlanBinding {
 public:
  // `table`: (qo_indptr, kv_indptr, kv_indices, kv_len_arr). Keywords:
  // FlashInfer's plan() arguments (num_heads, head_dim_ckv, head_dim_kpe,
  // page_size, causal, sm_scale, q_data_type, kv_data_type), num_pages and
  // num_threads.
  void Plan(const py::tuple& table, const py::kwargs& kwargs) {
    Keywords kw(kwargs);
    const rpa::DType q_dtype = DtypeByName(kw.Take("q_data_type"), "q_data_type");
    const py::object kv_dtype = kw.Take("kv_data_type");
    const rpa::MlaShape shape{
        kw.Required("num_heads"),
        kw.Required("head_dim_ckv"),
        kw.Required("head_dim_kpe"),
        kw.Required("page_size"),
        kw.Required("num_pages"),
        q_dtype,
        kv_dtype.is_none() ? q_dtype : DtypeByName(kv_dtype, "kv_data_type")};
    rpa::MlaOptions options;
    options.causal = kw.Bool("causal").value_or(false);
    options.sm_scale = kw.Float("sm_scale").value_or(1.0);
    options.num_threads = kw.Threads();
    kw.Done("MlaPlan.plan");
    const TableArrays t = TableArrays::Open(table, TableArrays::kMla);
    py::gil_scoped_release release;
    std::unique_lock lock(mutex_);
    plan_.Plan(shape, t.As<rpa::MlaPageTable>(), options);
  }

  // Keywords: lse, kv_scale and kv_dtype, which names a float8 cache's own
  // dtype (read from its uint8 view); without it a uint8 cache is read as
  // the planned float8 kv_dtype.
  py::object Run(py::handle q_nope, py::handle q_pe, py::handle ckv, py::handle kpe,
                 py::handle out, const py::kwargs& kwargs) {
    Keywords kw(kwargs);
    const Array qn = Array::Open(q_nope, "q_nope", false);
    const Array qp = Array::Open(q_pe, "q_pe", false);
    Array c = Array::Open(ckv, "ckv_cache", false);
    Array k = Array::Open(kpe, "kpe_cache", false);
    // A uint8 cache holds codes of the planned float8 dtype.
    std::optional<rpa::DType> as =
        ParseDtypeName(kw.Take("kv_dtype"), "kv_dtype", /*any_kv=*/true);
    if (!as) {
      py::gil_scoped_release release;
      std::shared_lock lock(mutex_);
      if (IsQuantized(plan_.shape().kv_dtype)) as = plan_.shape().kv_dtype;
    }
    c.Reinterpret(as, "ckv_cache", "kv_dtype");
    k.Reinterpret(as, "kpe_cache", "kv_dtype");
    rpa::MlaRunExtras extras;
    extras.kv_scale = kw.Float("kv_scale").value_or(1.0);
    const py::object lse = kw.Take("lse");
    kw.Done("MlaPlan.run");
    RowOutputs outputs(out, lse, {&qn, &qp, &c, &k});
    extras.lse = outputs.LseView();
    {
      py::gil_scoped_release release;
      std::shared_lock lock(mutex_);
      plan_.Run(qn.const_view(), qp.const_view(), c.const_view(), k.const_view(),
                outputs.out.view(), extras);
    }
    outputs.Commit();
    return py::reinterpret_borrow<py::object>(out);
  }

  py::dict Info() {
    py::gil_scoped_release release;
    std::shared_lock lock(mutex_);
    py::gil_scoped_acquire acquire;
    py::dict info;
    info["planned"] = plan_.planned();
    const rpa::MlaShape s = plan_.shape();
    info["num_tokens"] = plan_.num_tokens();
    info["num_heads"] = s.num_heads;
    info["head_dim_ckv"] = s.head_dim_ckv;
    info["head_dim_kpe"] = s.head_dim_kpe;
    info["page_size"] = s.page_size;
    info["num_pages"] = s.num_pages;
    info["q_data_type"] = std::string(rpa::ToString(s.q_dtype));
    info["kv_data_type"] = std::string(rpa::ToString(s.kv_dtype));
    info["causal"] = plan_.causal();
    info["num_seqs"] = plan_.num_seqs();
    info["num_threads"] = plan_.num_threads();
    info["kernels"] = plan_.DescribeKernels();
    return info;
  }

 private:
  rpa::MlaPlan plan_;
  std::shared_mutex mutex_;
};

// rpa.explain_block_sizes: (num_kv_pages_per_block, num_queries_per_block,
// source, explanation, section). Keywords: rpa::BlockSizeConfig's extents,
// vmem_limit_bytes.
py::tuple ChooseBlockSizes(const std::string& q_dtype, const std::string& kv_dtype,
                           const py::kwargs& kwargs) {
  auto parse = [](const std::string& name) {
    const std::optional<rpa::DType> dtype = rpa::DTypeFromString(name);
    if (!dtype) {
      throw rpa::Error(rpa::ErrorKind::kDtype, "dtype '" + name +
                                                   "' is not one rpa knows. Pass a dtype "
                                                   "name such as 'bfloat16'.");
    }
    return *dtype;
  };
  Keywords kw(kwargs);
  const int64_t page_size = std::max<int64_t>(kw.Required("page_size"), 1);
  const rpa::BlockSizeConfig config{parse(q_dtype),
                                    parse(kv_dtype),
                                    kw.Required("num_q_heads"),
                                    kw.Required("num_kv_heads"),
                                    kw.Required("head_dim"),
                                    page_size,
                                    kw.Required("max_num_batched_tokens"),
                                    page_size * kw.Required("pages_per_seq")};
  const std::optional<int64_t> vmem_limit_bytes = kw.Int("vmem_limit_bytes");
  kw.Done("choose_block_sizes");
  const rpa::BlockSizeChoice choice = rpa::ChooseBlockSizes(config, vmem_limit_bytes);
  return py::make_tuple(choice.sizes.num_kv_pages_per_block, choice.sizes.num_queries_per_block,
                        rpa::ToString(choice.source), choice.explanation, choice.section);
}

// For tests and debugging: how an argument reaches the library.
py::dict ViewInfo(py::handle obj, bool writable) {
  const Array a = Array::Open(obj, "x", writable);
  const rpa::MutableTensorView& v = a.view();
  py::dict info;
  info["data"] = reinterpret_cast<uintptr_t>(v.data);
  info["dtype"] = std::string(rpa::ToString(v.dtype));
  info["shape"] = std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.rank);
  info["strides"] = std::vector<int64_t>(v.strides.begin(), v.strides.begin() + v.rank);
  info["copied"] = a.copied();
  return info;
}

}  // namespace
}  // namespace rpa_python

#ifndef RPA_VERSION
#define RPA_VERSION "unknown"
#endif
#ifndef RPA_BUILD_TYPE
#define RPA_BUILD_TYPE "unknown"
#endif

PYBIND11_MODULE(_rpa, m) {
  using namespace rpa_python;
  m.doc() = "rpa's C++ binding. Use the functions of the `rpa` package instead.";

  static py::exception<rpa::Error> error(m, "Error", PyExc_ValueError);
  error_type = error;
  error.doc() =
      "A rejected input: a ValueError with rpa's message (JAX's wording and a fix) and a "
      "`kind` attribute: 'shape', 'dtype', 'layout', 'option', 'block_size', 'metadata' or "
      "'page_index'.";
  py::register_exception_translator(&TranslateErrors);

  m.attr("DEFAULT_MASK_VALUE") = rpa::kDefaultMaskValue;
  m.attr("__version__") = RPA_VERSION;
  py::dict build;
  build["version"] = RPA_VERSION;
  build["build_type"] = RPA_BUILD_TYPE;
#if defined(__clang__)
  build["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  build["compiler"] = std::string("gcc ") + __VERSION__;
#endif
  build["pybind11"] = std::to_string(PYBIND11_VERSION_MAJOR) + "." +
                      std::to_string(PYBIND11_VERSION_MINOR) + "." +
                      std::to_string(PYBIND11_VERSION_PATCH);
  build["kernels"] = rpa::DescribeKernels(rpa::DType::kBF16);
  m.attr("build_info") = build;

  // Every call's options travel as keywords (rpa/_api.py's one option list),
  // read once by the function above that converts them; the positional
  // arguments are its arrays, a page table as one tuple.
  m.def("ragged", &Ragged, py::arg("reference"), py::arg("q"), py::arg("k"),
        py::arg("v").none(true), py::arg("table"), py::arg("out"),
        "Runs a ragged call into `out` and returns it; see rpa.ragged_paged_attention.");
  m.def("ragged_kv_write", &RaggedWithKVWrite, py::arg("new_k"), py::arg("new_v"), py::arg("q"),
        py::arg("k"), py::arg("v").none(true), py::arg("table"), py::arg("out"),
        "Writes new_k/new_v into the cache, then attends into `out` and returns it; see "
        "rpa.ragged_paged_attention_with_kv_write.");
  m.def("validate", &Validate, py::arg("dynamic"), py::arg("q"), py::arg("k"),
        py::arg("v").none(true), py::arg("table"),
        "Static (dynamic=False) or static and dynamic checks of a ragged call.");
  m.def("paged", &Paged, py::arg("q"), py::arg("k_pages"), py::arg("v_pages"),
        py::arg("lengths"), py::arg("page_indices"), py::arg("out"),
        "Runs JAX's paged_attention into `out` and returns it; see rpa.paged_attention.");

  m.def("merge_states", &Merge, py::arg("out_a"), py::arg("lse_a"), py::arg("out_b"),
        py::arg("lse_b"), py::arg("out"), py::arg("lse"), py::kw_only(),
        py::arg("lse_base").none(true) = py::none(),
        "Merges two partial attentions into `out` and `lse`; see rpa.merge_states.");
  m.def("quantize", &Quantize, py::arg("x"), py::arg("dtype"), py::arg("scale").none(true),
        py::arg("out"), "Writes x / scale as `dtype` codes into `out`; see rpa.quantize.");
  m.def("dequantize", &Dequantize, py::arg("codes"), py::arg("dtype"),
        py::arg("scale").none(true), py::arg("out"),
        "Writes float32 codes * scale into `out`; see rpa.dequantize.");

  m.def("choose_block_sizes", &ChooseBlockSizes, py::arg("q_dtype"), py::arg("kv_dtype"),
        "(num_kv_pages_per_block, num_queries_per_block, source, explanation, section) the library "
        "chooses; see rpa.get_tuned_block_sizes.");
  m.def("load_tuned_block_sizes", &rpa::LoadTunedBlockSizes, py::arg("path"),
        "Loads a tuned block-size table (rpa tune's JSON); see rpa.load_tuned_block_sizes.");
  m.def("set_cpu_binding", &rpa::SetCpuBinding, py::arg("cpus"),
        "Pins rpa's workers process-wide (rpa::SetCpuBinding); see rpa.set_cpu_binding.");
  m.def("default_num_threads", &rpa::DefaultNumThreads,
        "The thread count a call without num_threads uses (rpa::DefaultNumThreads).");
  m.def("describe_threads", &rpa::DescribeThreads,
        "Why default_num_threads is what it is and where workers run (rpa::DescribeThreads).");

  py::class_<Plan>(m, "AttentionPlan",
                   "rpa::AttentionPlan: plan once per step, run per layer; see "
                   "rpa.BatchAttention.")
      .def(py::init<>())
      .def("plan", &Plan::PlanFrom, py::arg("form"), py::arg("table"),
           "Plans from JAX's page table (form='jax': kv_lens, page_indices, cu_q_lens, "
           "num_seqs) or FlashInfer's (form='csr': qo_indptr, kv_indptr, kv_indices, "
           "kv_last_page_len).")
      .def("run", &Plan::Run, py::arg("q"), py::arg("k"), py::arg("v").none(true),
           py::arg("out"), "Runs the plan into `out` (and `lse`) and returns out.")
      .def("info", &Plan::Info, "The planned shape, sequences, threads, tiles and kernels.");

  py::class_<MlaPlanBinding>(m, "MlaPlan",
                             "rpa::MlaPlan: FlashInfer's MLA plan / run; see "
                             "rpa.BatchMLAAttention.")
      .def(py::init<>())
      .def("plan", &MlaPlanBinding::Plan, py::arg("table"),
           "Plans from FlashInfer's MLA page table.")
      .def("run", &MlaPlanBinding::Run, py::arg("q_nope"), py::arg("q_pe"), py::arg("ckv_cache"),
           py::arg("kpe_cache"), py::arg("out"),
           "Runs the plan into `out` (and `lse`) and returns out.")
      .def("info", &MlaPlanBinding::Info, "The planned shape, sequences, threads and kernel.");

  m.def("view_info", &ViewInfo, py::arg("x"), py::arg("writable") = false,
        "How an array reaches the library: data pointer, dtype, shape, element strides and "
        "whether it had to be copied. For tests and debugging.");
}
