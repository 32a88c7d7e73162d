// The step's new q, k and v rows, as the model's projections would produce
// them. Drawing ~6k normal numbers per token and layer would cost more than
// the attention, so rows come from a pool drawn once and are picked per
// (layer, request, position): the same token always gets the same rows.
#ifndef RPA_TOOLS_DEMO_ACTIVATION_POOL_H_
#define RPA_TOOLS_DEMO_ACTIVATION_POOL_H_

#include <cstdint>
#include <vector>

#include "demo/model_shape.h"

namespace rpa::tools {

class ActivationPool {
 public:
  ActivationPool(const ModelShape& shape, int64_t rows, uint64_t seed);

  // One token's rows: q [num_q_heads, head_dim] in q's dtype, k and v
  // [num_kv_heads, head_dim] in the K/V dtype.
  const uint8_t* Q(int layer, int request, int32_t position) const;
  const uint8_t* K(int layer, int request, int32_t position) const;
  const uint8_t* V(int layer, int request, int32_t position) const;
  size_t QRowBytes() const { return q_row_bytes_; }
  size_t KvRowBytes() const { return kv_row_bytes_; }

 private:
  int64_t Row(int layer, int request, int32_t position, int64_t salt) const;

  int64_t rows_;
  size_t q_row_bytes_;
  size_t kv_row_bytes_;
  std::vector<uint8_t> q_;
  std::vector<uint8_t> kv_;  // K and V rows share one pool.
};

}  // namespace rpa::tools

#endif  // RPA_TOOLS_DEMO_ACTIVATION_POOL_H_
