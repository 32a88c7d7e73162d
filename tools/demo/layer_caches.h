// The model's paged KV cache: one JAX-layout cache per layer,
// [num_pages, page_size, 2 * num_kv_heads, head_dim], all layers sharing
// one page table (a page id names the same slots in every layer, as in vLLM).
#ifndef RPA_TOOLS_DEMO_LAYER_CACHES_H_
#define RPA_TOOLS_DEMO_LAYER_CACHES_H_

#include <cstdint>
#include <vector>

#include "demo/model_shape.h"
#include "rpa/tensor.h"

namespace rpa::tools {

class LayerCaches {
 public:
  // Every page starts as NaN (poison).
  LayerCaches(const ModelShape& shape, int32_t num_pages);

  MutableTensorView Layer(int layer);
  TensorView Layer(int layer) const;
  // Fills a freed page with NaN in every layer: a kernel that read a slot
  // no sequence owns, or one of a finished request, would poison its
  // output and fail verification instead of passing on stale numbers.
  void Poison(int32_t page);
  int64_t Bytes() const;

 private:
  ModelShape shape_;
  int32_t num_pages_;
  std::vector<uint8_t> poison_page_;          // One page of NaN in the K/V dtype.
  std::vector<std::vector<uint8_t>> layers_;
};

}  // namespace rpa::tools

#endif  // RPA_TOOLS_DEMO_LAYER_CACHES_H_
