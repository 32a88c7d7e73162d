#include "demo/layer_caches.h"

#include <cmath>
#include <cstring>

namespace rpa::tools {

LayerCaches::LayerCaches(const ModelShape& shape, int32_t num_pages)
    : shape_(shape), num_pages_(num_pages) {
  const size_t page_bytes = static_cast<size_t>(shape.PageElements()) * SizeOf(shape.kv_dtype);
  poison_page_.resize(page_bytes);
  for (int64_t i = 0; i < shape.PageElements(); ++i) {
    StoreFromF32(shape.kv_dtype, poison_page_.data(), i, NAN);
  }
  layers_.resize(static_cast<size_t>(shape.layers));
  for (std::vector<uint8_t>& layer : layers_) {
    layer.resize(page_bytes * static_cast<size_t>(num_pages));
    for (int32_t page = 0; page < num_pages; ++page) {
      std::memcpy(layer.data() + page_bytes * static_cast<size_t>(page), poison_page_.data(),
                  page_bytes);
    }
  }
}

MutableTensorView LayerCaches::Layer(int layer) {
  return MutableTensorView(layers_[static_cast<size_t>(layer)].data(), shape_.kv_dtype,
                           {num_pages_, shape_.page_size, 2 * shape_.num_kv_heads,
                            shape_.head_dim});
}

TensorView LayerCaches::Layer(int layer) const {
  return TensorView(layers_[static_cast<size_t>(layer)].data(), shape_.kv_dtype,
                    {num_pages_, shape_.page_size, 2 * shape_.num_kv_heads, shape_.head_dim});
}

void LayerCaches::Poison(int32_t page) {
  for (std::vector<uint8_t>& layer : layers_) {
    std::memcpy(layer.data() + poison_page_.size() * static_cast<size_t>(page),
                poison_page_.data(), poison_page_.size());
  }
}

int64_t LayerCaches::Bytes() const {
  return static_cast<int64_t>(poison_page_.size()) * num_pages_ * shape_.layers;
}

}  // namespace rpa::tools
