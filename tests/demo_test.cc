// `rpa demo`'s serving loop, piece by piece (tools/demo/): the page free
// list, the request stream, the scheduler's invariants over a whole run, the
// sampled reference check (it must catch a wrong output), the plot (its
// panels' colours where they belong, the PNG read back by Cairo) and a small
// loop end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "demo/page_allocator.h"
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

// Pixels of exactly `c` (0xRRGGBB) in rows [top, bottom) of an RGB24 image:
// the insides of filled shapes, which antialiasing leaves unblended.
int CountColor(cairo_surface_t* image, uint32_t c, int top, int bottom) {
  const unsigned char* data = cairo_image_surface_get_data(image);
  const int stride = cairo_image_surface_get_stride(image);
  int n = 0;
  for (int y = top; y < bottom; ++y) {
    const auto* row = reinterpret_cast<const uint32_t*>(data + y * stride);
    for (int x = 0; x < cairo_image_surface_get_width(image); ++x) n += (row[x] & 0xFFFFFF) == c;
  }
  return n;
}

constexpr uint32_t kPrefillRgb = 0x3465A4, kDecodeRgb = 0xF57900, kCheckedRgb = 0x00963C;

TEST(DemoPlotTest, DrawsEachSeriesInItsPanel) {
  const std::vector<StepPoint> steps = {
      {45, 500, 0, true}, {8, 0, 20, false}, {30, 200, 18, true}};
  const Surface image = DrawStepPlot(steps, "test");
  ASSERT_EQ(cairo_surface_status(image.get()), CAIRO_STATUS_SUCCESS);
  EXPECT_EQ(cairo_image_surface_get_width(image.get()), kPlotWidth);
  EXPECT_EQ(cairo_image_surface_get_height(image.get()), kPlotHeight);
  // The time panel (0-50 ms): two checked-step marks (discs of radius 4.5,
  // ~50 solid pixels each, inside the panel), and no bars.
  EXPECT_GT(CountColor(image.get(), kCheckedRgb, kTimePanelTop, kTimePanelBottom), 2 * 40);
  EXPECT_EQ(CountColor(image.get(), kPrefillRgb, kTimePanelTop, kTimePanelBottom), 0);
  // The tokens panel: both kinds of bars, prefill taller than decode (500 +
  // 200 tokens against 38 on a 600-token axis); no marks.
  const int prefill = CountColor(image.get(), kPrefillRgb, kTokensPanelTop, kTokensPanelBottom);
  const int decode = CountColor(image.get(), kDecodeRgb, kTokensPanelTop, kTokensPanelBottom);
  EXPECT_GT(decode, 100);
  EXPECT_GT(prefill, 10 * decode);
  EXPECT_EQ(CountColor(image.get(), kCheckedRgb, kTokensPanelTop, kTokensPanelBottom), 0);
  // The legend's three swatches under the panels.
  for (const uint32_t c : {kPrefillRgb, kDecodeRgb, kCheckedRgb}) {
    EXPECT_EQ(CountColor(image.get(), c, kTokensPanelBottom + 40, kPlotHeight), 14 * 14) << c;
  }
  // Text is drawn (antialiased: shades between ink and white) in the title row.
  int shades = 0;
  for (uint32_t v = 0x303030; v < 0xF0F0F0; v += 0x010101) shades += CountColor(image.get(), v, 0, 40);
  EXPECT_GT(shades, 20);
}

TEST(DemoPlotTest, WritesAPngThatReadsBackAndNamesAPathItCannotWrite) {
  const Surface image = DrawStepPlot({{10, 100, 4, true}, {5, 0, 5, false}}, "png");
  const std::string path = ::testing::TempDir() + "rpa_demo_plot.png";
  WritePng(image.get(), path);
  const Surface back(cairo_image_surface_create_from_png(path.c_str()));
  ASSERT_EQ(cairo_surface_status(back.get()), CAIRO_STATUS_SUCCESS);
  EXPECT_EQ(cairo_image_surface_get_width(back.get()), kPlotWidth);
  EXPECT_EQ(cairo_image_surface_get_height(back.get()), kPlotHeight);
  for (const uint32_t c : {kPrefillRgb, kDecodeRgb, kCheckedRgb}) {
    EXPECT_EQ(CountColor(back.get(), c, 0, kPlotHeight), CountColor(image.get(), c, 0, kPlotHeight));
  }
  const std::string bad = ::testing::TempDir() + "no-such-dir/plot.png";
  try {
    WritePng(image.get(), bad);
    ADD_FAILURE() << "wrote " << bad;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
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
