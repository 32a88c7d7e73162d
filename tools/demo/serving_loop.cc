#include "demo/serving_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "demo/activation_pool.h"
#include "demo/layer_caches.h"
#include "demo/page_allocator.h"
#include "demo/step_attention.h"
#include "demo/step_batch.h"

namespace rpa::tools {
namespace {

testing::WorkCount StepWork(const ModelShape& shape, const StepSchedule& schedule) {
  testing::BatchSpec spec = BatchSpecOf(shape);
  for (const ScheduledSeq& seq : schedule.seqs) spec.sequences.push_back({seq.q_len, seq.kv_len});
  testing::WorkCount work = testing::CountWork(spec);
  work.flops *= shape.layers;
  work.kv_bytes *= shape.layers;
  return work;
}

// Layer `layer`'s call of the step just run, as the reference sees it.
SampledCheck CheckLayer(const LoopConfig& config, const StepBatch& batch,
                        const LayerCaches& caches, int layer) {
  const FinishedCall call{batch.Q(layer), caches.Layer(layer), batch.Table(), config.options,
                          batch.Out(layer)};
  return CheckSampledRows(call, config.check_rows);
}

void Record(LoopResult& result, const StepRecord& record) {
  result.prefill_tokens += record.point.prefill_tokens;
  result.decode_tokens += record.point.decode_tokens;
  result.seconds += record.point.ms * 1e-3;
  if (record.point.checked) {
    ++result.checks;
    result.checked_rows += record.check.rows;
    result.worst_ratio = WorseRatio(result.worst_ratio, record.check.ratio);
  }
  result.steps.push_back(record);
}

}  // namespace

LoopResult RunServingLoop(const LoopConfig& config,
                          const std::function<void(const LoopProgress&)>& progress) {
  const ModelShape& shape = config.shape;
  PageAllocator pages(config.num_pages, config.seed);
  Scheduler scheduler(MakeRequestStream(config.stream), config.limits, pages);
  LayerCaches caches(shape, config.num_pages);
  const ActivationPool activations(shape, 4096, config.seed + 1);
  StepBatch batch(shape, StepBatchSize{config.limits.token_budget, config.limits.max_running,
                                       scheduler.MaxPagesPerSeq()});
  LoopResult result;
  result.requests = scheduler.num_requests();
  const int64_t max_steps = config.max_steps > 0 ? config.max_steps : INT64_MAX;
  for (int64_t step = 0; step < max_steps && !scheduler.Done();) {
    const StepSchedule& schedule = scheduler.Schedule();
    if (schedule.seqs.empty()) continue;  // Idle: the clock jumped to the next arrival.
    batch.Build(schedule, activations);

    StepRecord record;
    const auto start = std::chrono::steady_clock::now();
    RunStepAttention(batch, caches, config.options);
    record.point.ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    record.point.prefill_tokens = schedule.prefill_tokens;
    record.point.decode_tokens = schedule.decode_tokens;
    record.work = StepWork(shape, schedule);

    // Before Complete: a finishing request's pages are still its own.
    const bool last = step + 1 == max_steps;
    if (step % std::max(config.check_every, 1) == 0 || last) {
      record.point.checked = true;
      record.check = CheckLayer(config, batch, caches, result.checks % shape.layers);
    }
    for (const int32_t page : scheduler.Complete()) caches.Poison(page);
    Record(result, record);
    ++step;
    if (progress) {
      progress(LoopProgress{step, scheduler.running(), scheduler.waiting(), scheduler.finished(),
                            scheduler.num_requests(), pages.num_free(), pages.num_pages(),
                            &result.steps.back()});
    }
  }
  result.finished = scheduler.finished();
  return result;
}

}  // namespace rpa::tools
