#include "demo/request_stream.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace rpa::tools {

std::vector<Request> MakeRequestStream(const StreamSpec& spec) {
  std::mt19937_64 rng(spec.seed);
  std::uniform_real_distribution<double> log_prompt(std::log(std::max(spec.min_prompt, 1)),
                                                    std::log(std::max(spec.max_prompt, 1)));
  std::uniform_int_distribution<int32_t> output(std::max(spec.min_output, 1),
                                                std::max(spec.max_output, spec.min_output));
  std::exponential_distribution<double> gap(std::max(spec.arrivals_per_step, 1e-6));
  std::vector<Request> requests;
  double clock = 0.0;
  for (int i = 0; i < spec.num_requests; ++i) {
    if (i >= spec.initial) clock += gap(rng);
    Request r;
    r.id = i;
    r.arrival_step = static_cast<int64_t>(clock);
    r.prompt_len = std::clamp(static_cast<int32_t>(std::lround(std::exp(log_prompt(rng)))),
                              std::max(spec.min_prompt, 1), std::max(spec.max_prompt, 1));
    r.output_len = output(rng);
    requests.push_back(r);
  }
  return requests;
}

}  // namespace rpa::tools
