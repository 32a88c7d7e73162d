// The demo's traffic: requests with a prompt and an output length arriving
// over the steps, drawn from a seeded random stream (the same run every time).
#ifndef RPA_TOOLS_DEMO_REQUEST_STREAM_H_
#define RPA_TOOLS_DEMO_REQUEST_STREAM_H_

#include <cstdint>
#include <vector>

namespace rpa::tools {

struct Request {
  int id = 0;
  int64_t arrival_step = 0;  // The first step it may be scheduled in.
  int32_t prompt_len = 1;
  int32_t output_len = 1;    // Tokens generated, the first by the prefill's last step.
};

struct StreamSpec {
  int num_requests = 64;
  int initial = 12;                 // Arrive at step 0, the rest one by one.
  double arrivals_per_step = 0.4;   // Poisson rate after that.
  // Prompts log-uniform (many short, some long, as in chat traffic);
  // outputs uniform.
  int32_t min_prompt = 32;
  int32_t max_prompt = 1024;
  int32_t min_output = 16;
  int32_t max_output = 128;
  uint64_t seed = 2026;
};

// Ordered by arrival; ids 0, 1, ... in that order.
std::vector<Request> MakeRequestStream(const StreamSpec& spec);

}  // namespace rpa::tools

#endif  // RPA_TOOLS_DEMO_REQUEST_STREAM_H_
