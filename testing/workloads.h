// The representative serving steps that `rpa bench` and `rpa tune` measure,
// for any model's head configuration.
#ifndef RPA_TESTING_WORKLOADS_H_
#define RPA_TESTING_WORKLOADS_H_

#include <string>
#include <vector>

#include "testing/synthetic_batch.h"

namespace rpa::testing {

struct HeadConfig {
  std::string name;
  int64_t num_q_heads = 32;
  int64_t num_kv_heads = 8;
  int64_t head_dim = 128;
};

// Model presets: Llama-3-8B, a Llama-3-70B tensor-parallel shard (8 of 64 q
// heads, 1 of 8 kv heads), Qwen-style 28/4, Gemma-style head_dim 256, MQA.
const std::vector<HeadConfig>& ModelPresets();

// decode: 16 x (q 1, kv 1024). decode-long: 1 x (q 1, kv 32768). prefill: 1 x (q = kv = prefill_len).
// mixed: JAX's mixed test shape, 16 sequences of q_len 1 and chunked
// prefills up to 251 tokens over histories up to 1328.
std::vector<SequenceShape> DecodeSequences();
std::vector<SequenceShape> DecodeLongSequences();
std::vector<SequenceShape> PrefillSequences(int32_t prefill_len);
std::vector<SequenceShape> MixedSequences();
// verify: speculative verification, 16 x (q 4, kv 1024): 4 draft tokens per
// sequence checked at once (16 rows per kv head at GQA 4: the middle class).
std::vector<SequenceShape> VerifySequences();

// The work of a batch: FLOPs of q.k and p.v over the visible (causal) keys,
// 4 * head_dim per (query row, key, q head), and its unique K/V bytes.
struct WorkCount {
  double flops = 0;
  double kv_bytes = 0;
};
WorkCount CountWork(const BatchSpec& spec);

}  // namespace rpa::testing

#endif  // RPA_TESTING_WORKLOADS_H_
