// The attention shape of the demo's model: llama-3-8B's by default.
#ifndef RPA_TOOLS_DEMO_MODEL_SHAPE_H_
#define RPA_TOOLS_DEMO_MODEL_SHAPE_H_

#include <cstdint>

#include "rpa/dtype.h"

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

}  // namespace rpa::tools

#endif  // RPA_TOOLS_DEMO_MODEL_SHAPE_H_
