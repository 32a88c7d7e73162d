#include "testing/workloads.h"

namespace rpa::testing {

const std::vector<HeadConfig>& ModelPresets() {
  static const std::vector<HeadConfig> presets = {
      {"llama3-8b", 32, 8, 128},      {"llama3-70b-tp8", 8, 1, 128}, {"qwen-28-4", 28, 4, 128},
      {"gemma-hd256", 16, 8, 256},    {"mqa", 32, 1, 128},
  };
  return presets;
}

std::vector<SequenceShape> DecodeSequences() { return std::vector<SequenceShape>(16, {1, 1024}); }

std::vector<SequenceShape> DecodeLongSequences() { return {{1, 32768}}; }

std::vector<SequenceShape> VerifySequences() { return std::vector<SequenceShape>(16, {4, 1024}); }

std::vector<SequenceShape> PrefillSequences(int32_t prefill_len) {
  return {{prefill_len, prefill_len}};
}

std::vector<SequenceShape> MixedSequences() {
  return {{1, 1328},  {5, 18},   {1, 129},  {120, 229}, {1, 122},  {1, 64},
          {32, 100},  {250, 463}, {1, 18},  {1, 17},    {99, 123}, {1, 597},
          {251, 1107}, {1, 322},  {64, 181}, {1, 1229}};
}

WorkCount CountWork(const BatchSpec& spec) {
  WorkCount work;
  for (const SequenceShape& s : spec.sequences) {
    double keys = 0;  // Sum over query rows of visible keys.
    for (int32_t j = 0; j < s.q_len; ++j) keys += s.kv_len - s.q_len + j + 1;
    work.flops += keys * static_cast<double>(spec.num_q_heads) * 4.0 * static_cast<double>(spec.head_dim);
    work.kv_bytes += static_cast<double>(s.kv_len) * static_cast<double>(spec.num_kv_heads) * 2.0 *
                     static_cast<double>(spec.head_dim) * static_cast<double>(SizeOf(spec.kv_dtype));
  }
  return work;
}

}  // namespace rpa::testing
