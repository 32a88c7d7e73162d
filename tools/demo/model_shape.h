// The attention shape of the demo's model: llama-3-8B's by default.
#ifndef RPA_TOOLS_DEMO_MODEL_SHAPE_H_
#define RPA_TOOLS_DEMO_MODEL_SHAPE_H_

#include <cstdint>

#include "rpa/dtype.h"
#include "testing/synthetic_batch.h"

namespace rpa::tools {

struct ModelShape {
  int layers = 4;
  int64_t num_q_heads = 32;
  int64_t num_kv_heads = 8;
  int64_t head_dim = 128;
  int64_t page_size = 16;
  DType q_dtype = DType::kBF16;
  DType kv_dtype = DType::kBF16;

  int64_t QRowElements() const { return num_q_heads * head_dim; }
  int64_t KvRowElements() const { return num_kv_heads * head_dim; }
  // One page of the combined cache: [page_size, 2 * num_kv_heads, head_dim].
  int64_t PageElements() const { return page_size * 2 * KvRowElements(); }
};

// A synthetic batch (testing/synthetic_batch.h) of one layer of this shape,
// without sequences.
inline testing::BatchSpec BatchSpecOf(const ModelShape& shape) {
  testing::BatchSpec spec;
  spec.num_q_heads = shape.num_q_heads;
  spec.num_kv_heads = shape.num_kv_heads;
  spec.head_dim = shape.head_dim;
  spec.page_size = shape.page_size;
  spec.q_dtype = shape.q_dtype;
  spec.kv_dtype = shape.kv_dtype;
  return spec;
}

}  // namespace rpa::tools

#endif  // RPA_TOOLS_DEMO_MODEL_SHAPE_H_
