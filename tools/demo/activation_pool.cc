#include "demo/activation_pool.h"

#include <random>

namespace rpa::tools {
namespace {

std::vector<uint8_t> NormalRows(DType dtype, int64_t elements, std::mt19937_64& rng) {
  std::vector<uint8_t> buffer(static_cast<size_t>(elements) * SizeOf(dtype));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < elements; ++i) StoreFromF32(dtype, buffer.data(), i, normal(rng));
  return buffer;
}

}  // namespace

ActivationPool::ActivationPool(const ModelShape& shape, int64_t rows, uint64_t seed)
    : rows_(rows),
      q_row_bytes_(static_cast<size_t>(shape.QRowElements()) * SizeOf(shape.q_dtype)),
      kv_row_bytes_(static_cast<size_t>(shape.KvRowElements()) * SizeOf(shape.kv_dtype)) {
  std::mt19937_64 rng(seed);
  q_ = NormalRows(shape.q_dtype, rows * shape.QRowElements(), rng);
  kv_ = NormalRows(shape.kv_dtype, rows * shape.KvRowElements(), rng);
}

// A hash, so that neighbouring tokens and layers get unrelated rows.
int64_t ActivationPool::Row(int layer, int request, int32_t position, int64_t salt) const {
  uint64_t h = static_cast<uint64_t>(layer) * 0x9E3779B97F4A7C15ull ^
               static_cast<uint64_t>(request) * 0xC2B2AE3D27D4EB4Full ^
               static_cast<uint64_t>(position) * 0x165667B19E3779F9ull ^
               static_cast<uint64_t>(salt) * 0x27D4EB2F165667C5ull;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  return static_cast<int64_t>(h % static_cast<uint64_t>(rows_));
}

const uint8_t* ActivationPool::Q(int layer, int request, int32_t position) const {
  return q_.data() + static_cast<size_t>(Row(layer, request, position, 0)) * q_row_bytes_;
}
const uint8_t* ActivationPool::K(int layer, int request, int32_t position) const {
  return kv_.data() + static_cast<size_t>(Row(layer, request, position, 1)) * kv_row_bytes_;
}
const uint8_t* ActivationPool::V(int layer, int request, int32_t position) const {
  return kv_.data() + static_cast<size_t>(Row(layer, request, position, 2)) * kv_row_bytes_;
}

}  // namespace rpa::tools
