#include "workloads.h"

namespace rpa::tools {

const std::vector<HeadConfig>& ModelPresets() {
  static const std::vector<HeadConfig> presets = {
      {"llama3-8b", 32, 8, 128},      {"llama3-70b-tp8", 8, 1, 128}, {"qwen-28-4", 28, 4, 128},
      {"gemma-hd256", 16, 8, 256},    {"mqa", 32, 1, 128},
  };
  return presets;
}

std::vector<SequenceShape> DecodeSequences() { return std::vector<SequenceShape>(16, {1, 1024}); }

std::vector<SequenceShape> DecodeLongSequences() { return {{1, 32768}}; }

std::vector<SequenceShape> PrefillSequences(int32_t prefill_len) {
  return {{prefill_len, prefill_len}};
}

std::vector<SequenceShape> MixedSequences() {
  return {{1, 1328},  {5, 18},   {1, 129},  {120, 229}, {1, 122},  {1, 64},
          {32, 100},  {250, 463}, {1, 18},  {1, 17},    {99, 123}, {1, 597},
          {251, 1107}, {1, 322},  {64, 181}, {1, 1229}};
}

}  // namespace rpa::tools
