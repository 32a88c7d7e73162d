// `rpa demo`'s serving loop, piece by piece (tools/demo/): the page free
// list, the request stream, the scheduler's invariants over a whole run, the
// sampled reference check (it must catch a wrong output), the PNG encoder
// (decoded back with zlib) and a small loop end to end.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "demo/page_allocator.h"
#include "demo/png_writer.h"
#include "demo/request_stream.h"
#include "demo/sampled_check.h"
#include "demo/scheduler.h"
#include "demo/serving_loop.h"
#include "demo/step_plot.h"
#include "rpa/rpa.h"
#include "testing/synthetic_batch.h"

namespace rpa::tools {
namespace {

TEST(DemoPageAllocatorTest, HandsOutEveryPageOnceAndTakesThemBack) {
  PageAllocator pages(8, 1);
  std::set<int32_t> taken;
  for (int i = 0; i < 8; ++i) taken.insert(pages.Allocate());
  EXPECT_EQ(taken.size(), 8u);
  EXPECT_EQ(*taken.begin(), 0);
  EXPECT_EQ(*taken.rbegin(), 7);
  EXPECT_THROW(pages.Allocate(), std::logic_error);
  pages.Free(3);
  EXPECT_THROW(pages.Free(3), std::logic_error);  // Double free.
  EXPECT_THROW(pages.Free(8), std::logic_error);
  EXPECT_EQ(pages.num_free(), 1);
  EXPECT_EQ(pages.Allocate(), 3);  // Last freed, first reused.
}

TEST(DemoRequestStreamTest, SeededAndWithinBounds) {
  StreamSpec spec;
  spec.num_requests = 50;
  const std::vector<Request> a = MakeRequestStream(spec);
  const std::vector<Request> b = MakeRequestStream(spec);
  ASSERT_EQ(a.size(), 50u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].id, static_cast<int>(i));
    EXPECT_EQ(a[i].prompt_len, b[i].prompt_len);
    EXPECT_GE(a[i].prompt_len, spec.min_prompt);
    EXPECT_LE(a[i].prompt_len, spec.max_prompt);
    EXPECT_GE(a[i].output_len, spec.min_output);
    EXPECT_LE(a[i].output_len, spec.max_output);
    if (i < static_cast<size_t>(spec.initial)) {
      EXPECT_EQ(a[i].arrival_step, 0);
    }
    if (i > 0) {
      EXPECT_GE(a[i].arrival_step, a[i - 1].arrival_step);
    }
  }
}

// Runs the scheduler alone over a stream and checks what every step asks for.
TEST(DemoSchedulerTest, EveryStepRespectsTheLimitsAndEveryRequestCompletes) {
  StreamSpec spec;
  spec.num_requests = 30;
  spec.max_prompt = 300;
  spec.max_output = 40;
  const std::vector<Request> requests = MakeRequestStream(spec);
  SchedulerLimits limits;
  limits.token_budget = 128;
  limits.max_running = 8;
  limits.page_size = 16;
  PageAllocator pages(160, 2);
  Scheduler scheduler(requests, limits, pages);
  std::map<int, int32_t> prefilled, decoded, cached;
  int steps = 0;
  while (!scheduler.Done() && steps < 100000) {
    const StepSchedule& s = scheduler.Schedule();
    if (s.seqs.empty()) continue;
    ++steps;
    EXPECT_LE(s.Tokens(), limits.token_budget);
    EXPECT_LE(static_cast<int>(s.seqs.size()), limits.max_running);
    std::set<int32_t> step_pages;
    bool prefill_seen = false;
    for (const ScheduledSeq& seq : s.seqs) {
      EXPECT_TRUE(seq.prefill || !prefill_seen) << "decodes come first";
      prefill_seen |= seq.prefill;
      const Request& r = requests[static_cast<size_t>(seq.request)];
      EXPECT_GE(r.arrival_step, 0);
      EXPECT_LE(r.arrival_step, scheduler.clock());
      EXPECT_EQ(seq.kv_len, cached[seq.request] + seq.q_len);
      cached[seq.request] = seq.kv_len;
      (seq.prefill ? prefilled : decoded)[seq.request] += seq.q_len;
      EXPECT_EQ(static_cast<int32_t>(seq.pages->size()), (seq.kv_len + 15) / 16);
      for (const int32_t page : *seq.pages) EXPECT_TRUE(step_pages.insert(page).second);
    }
    scheduler.Complete();
  }
  EXPECT_EQ(scheduler.finished(), spec.num_requests);
  EXPECT_EQ(pages.num_free(), pages.num_pages());  // Every page came back.
  for (const Request& r : requests) {
    EXPECT_EQ(prefilled[r.id], r.prompt_len);
    EXPECT_EQ(decoded[r.id], r.output_len - 1);  // The first token comes from the prefill.
  }
}

TEST(DemoSchedulerTest, RejectsRequestsTheCacheCannotHold) {
  PageAllocator pages(4, 1);
  std::vector<Request> requests = {{0, 0, 100, 10}};
  try {
    Scheduler scheduler(requests, SchedulerLimits{}, pages);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "Scheduler: request 0 (prompt 100, output 10 tokens) needs 7 pages; the cache has "
              "4. Give it more pages or shorter requests.");
  }
}

// The fast path on a synthetic step, checked; then a wrong element must fail.
TEST(DemoSampledCheckTest, PassesTheKernelAndCatchesAWrongRow) {
  testing::BatchSpec spec;
  spec.num_q_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.sequences = {{1, 40}, {20, 50}, {3, 3}};
  const testing::SyntheticBatch batch = testing::MakeSyntheticBatch(spec);
  const PageTable table{batch.KvLens(), batch.PageIndices(), batch.CuQLens(), batch.NumSeqs()};
  AttentionOptions options;
  options.sm_scale = 0.125;
  std::vector<uint8_t> out = batch.NewOutput();
  RaggedPagedAttention(batch.Q(), batch.KvPages(), table, options, batch.OutView(out));
  const FinishedCall call{batch.Q(), batch.KvPages(), table, options, batch.OutView(out)};
  const SampledCheck good = CheckSampledRows(call, 4);
  EXPECT_TRUE(good.Passed()) << good.ratio;
  EXPECT_EQ(good.rows, 1 + 8 + 3);  // Decode 1; 20 rows: first 4 and last 4; all 3.

  // The second sequence's first row (q row 1) and its 18th (row 18, not sampled).
  const int64_t row = batch.spec.num_q_heads * batch.spec.head_dim;
  std::vector<uint8_t> wrong = out;
  StoreFromF32(batch.spec.q_dtype, wrong.data(), 1 * row + 5, 1.0f + LoadAsF32(batch.spec.q_dtype, out.data(), row + 5));
  EXPECT_FALSE(CheckSampledRows({batch.Q(), batch.KvPages(), table, options, batch.OutView(wrong)}, 4)
                   .Passed());
  wrong = out;
  StoreFromF32(batch.spec.q_dtype, wrong.data(), 20 * row, NAN);  // Last row of sequence 1.
  EXPECT_TRUE(std::isnan(
      CheckSampledRows({batch.Q(), batch.KvPages(), table, options, batch.OutView(wrong)}, 4).ratio));
  wrong = out;
  StoreFromF32(batch.spec.q_dtype, wrong.data(), 10 * row, 100.0f);  // Row 10: not sampled.
  EXPECT_TRUE(CheckSampledRows({batch.Q(), batch.KvPages(), table, options, batch.OutView(wrong)}, 4)
                  .Passed());
}

uint32_t U32(const std::vector<uint8_t>& b, size_t at) {
  return uint32_t{b[at]} << 24 | uint32_t{b[at + 1]} << 16 | uint32_t{b[at + 2]} << 8 | b[at + 3];
}

TEST(DemoPngTest, DecodesBackWithZlib) {
  const int w = 3, h = 2;
  std::vector<uint8_t> rgb(w * h * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 13);
  const std::vector<uint8_t> png = EncodePng(w, h, rgb);
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(std::memcmp(png.data(), "\x89PNG\r\n\x1a\n", 8), 0);
  std::vector<std::string> types;
  std::vector<uint8_t> idat;
  for (size_t at = 8; at + 12 <= png.size();) {
    const uint32_t length = U32(png, at);
    const std::string type(png.begin() + at + 4, png.begin() + at + 8);
    types.push_back(type);
    const uLong crc = crc32(0L, png.data() + at + 4, 4 + length);
    EXPECT_EQ(U32(png, at + 8 + length), static_cast<uint32_t>(crc)) << type;
    if (type == "IHDR") {
      EXPECT_EQ(U32(png, at + 8), 3u);
      EXPECT_EQ(U32(png, at + 12), 2u);
      EXPECT_EQ(png[at + 16], 8);  // Bit depth.
      EXPECT_EQ(png[at + 17], 2);  // RGB.
    }
    if (type == "IDAT") idat.assign(png.begin() + at + 8, png.begin() + at + 8 + length);
    at += 12 + length;
  }
  EXPECT_EQ(types, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  std::vector<uint8_t> raw((w * 3 + 1) * h);
  uLongf raw_size = raw.size();
  ASSERT_EQ(uncompress(raw.data(), &raw_size, idat.data(), idat.size()), Z_OK);
  ASSERT_EQ(raw_size, raw.size());
  for (int y = 0; y < h; ++y) {
    EXPECT_EQ(raw[y * (w * 3 + 1)], 0);  // Filter: none.
    EXPECT_TRUE(std::equal(rgb.begin() + y * w * 3, rgb.begin() + (y + 1) * w * 3,
                           raw.begin() + y * (w * 3 + 1) + 1));
  }
  EXPECT_THROW(EncodePng(3, 2, std::vector<uint8_t>(5)), std::invalid_argument);
}

TEST(DemoPlotTest, DrawsBothPanels) {
  std::vector<StepPoint> steps = {{50, 500, 0, true}, {8, 0, 20, false}, {30, 200, 18, true}};
  const Canvas c = DrawStepPlot(steps, "test");
  auto count = [&](uint8_t r, uint8_t g, uint8_t b) {
    int n = 0;
    for (size_t i = 0; i < c.rgb().size(); i += 3) {
      n += c.rgb()[i] == r && c.rgb()[i + 1] == g && c.rgb()[i + 2] == b;
    }
    return n;
  };
  EXPECT_GT(count(52, 101, 164), 100);  // Prefill bars (and the legend).
  EXPECT_GT(count(245, 121, 0), 100);   // Decode bars.
  EXPECT_GT(count(0, 150, 60), 2 * 49);  // Two checked-step marks and the legend.
}

// A small loop end to end: every request finishes, every check passes.
TEST(DemoServingLoopTest, SmallLoopFinishesAndVerifies) {
  LoopConfig config;
  config.shape.layers = 2;
  config.shape.num_q_heads = 8;
  config.shape.num_kv_heads = 2;
  config.shape.head_dim = 64;
  config.stream.num_requests = 10;
  config.stream.initial = 4;
  config.stream.arrivals_per_step = 0.5;
  config.stream.max_prompt = 200;
  config.stream.max_output = 24;
  config.limits.token_budget = 64;
  config.limits.max_running = 6;
  config.num_pages = 128;
  config.check_every = 3;
  config.options.sm_scale = 0.125;
  int updates = 0;
  const LoopResult result = RunServingLoop(config, [&](const LoopProgress&) { ++updates; });
  EXPECT_EQ(result.finished, 10);
  EXPECT_TRUE(result.Passed()) << result.worst_ratio;
  EXPECT_EQ(updates, static_cast<int>(result.steps.size()));
  int64_t prompt = 0, output = 0;
  for (const Request& r : MakeRequestStream(config.stream)) {
    prompt += r.prompt_len;
    output += r.output_len - 1;
  }
  EXPECT_EQ(result.prefill_tokens, prompt);
  EXPECT_EQ(result.decode_tokens, output);
  EXPECT_EQ(result.checks, static_cast<int>((result.steps.size() + 2) / 3));
}

}  // namespace
}  // namespace rpa::tools
