// Continuous batching with chunked prefill, as vLLM schedules a step: every
// running request that is decoding gets its one token first, then prompts
// are prefilled in arrival order in chunks that fill the step's token
// budget; a waiting request is admitted when a running slot is free and
// the cache can hold all its tokens (pages are reserved on admission, so
// no request ever has to be preempted), and its pages are taken from the
// free list as its tokens are written and returned when it finishes.
#ifndef RPA_TOOLS_DEMO_SCHEDULER_H_
#define RPA_TOOLS_DEMO_SCHEDULER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "demo/page_allocator.h"
#include "demo/request_stream.h"

namespace rpa::tools {

struct SchedulerLimits {
  int32_t token_budget = 512;  // Query tokens per step (max_num_batched_tokens).
  int max_running = 24;        // Sequences per step (max_num_seqs); <= token_budget.
  int32_t page_size = 16;
};

// One sequence of a step, in the order of the step's batch.
struct ScheduledSeq {
  int request = 0;       // Request id.
  int32_t q_len = 1;     // New tokens this step.
  int32_t kv_len = 1;    // Tokens in the cache after this step, the new ones included.
  bool prefill = false;  // A prompt chunk (else one decode token).
  // The sequence's pages, in order; valid until Complete().
  const std::vector<int32_t>* pages = nullptr;
};

struct StepSchedule {
  std::vector<ScheduledSeq> seqs;  // Decodes first, then prompt chunks.
  int32_t prefill_tokens = 0;
  int32_t decode_tokens = 0;
  int32_t Tokens() const { return prefill_tokens + decode_tokens; }
};

class Scheduler {
 public:
  // Throws std::invalid_argument when a request could never be admitted
  // (more tokens than the cache holds) or the limits do not fit together.
  Scheduler(std::vector<Request> requests, const SchedulerLimits& limits, PageAllocator& pages);

  bool Done() const { return next_arrival_ == requests_.size() && running_.empty(); }
  // Admits what has arrived and fits, then picks the step's tokens and
  // takes the pages they are written to. Empty when nothing has arrived yet:
  // the clock then jumps to the next arrival.
  const StepSchedule& Schedule();
  // After the step ran: the tokens are in the cache; requests that
  // generated their last token finish and return their pages, which it
  // lists (valid until the next Complete).
  const std::vector<int32_t>& Complete();

  // The most pages one request will hold: the page table's pages_per_seq.
  int32_t MaxPagesPerSeq() const;
  int64_t clock() const { return clock_; }
  int running() const { return static_cast<int>(running_.size()); }
  int waiting() const;
  int finished() const { return finished_; }
  int num_requests() const { return static_cast<int>(requests_.size()); }

 private:
  struct Live {
    int request = 0;
    int32_t cached = 0;      // Tokens whose K/V are in the cache.
    int32_t generated = 0;   // Output tokens sampled so far.
    int32_t reserved = 0;    // Pages still to take, of those reserved at admission.
    std::vector<int32_t> pages;
  };

  int32_t PagesFor(int32_t tokens) const;
  int32_t PagesNeeded(const Request& r) const;  // For every token it will write.
  void Admit();
  void TakePages(Live& live, int32_t kv_len);
  void Release(Live& live);

  std::vector<Request> requests_;
  SchedulerLimits limits_;
  PageAllocator& pages_;
  size_t next_arrival_ = 0;   // requests_[next_arrival_] has not arrived (or not fit) yet.
  std::deque<Live> running_;  // Admission order.
  int32_t reserved_ = 0;      // Sum of running requests' reserved pages.
  int64_t clock_ = 0;         // The step being scheduled.
  int finished_ = 0;
  StepSchedule schedule_;
  std::vector<size_t> scheduled_slots_;  // running_ index of each of schedule_.seqs.
  std::vector<int32_t> freed_;
};

}  // namespace rpa::tools

#endif  // RPA_TOOLS_DEMO_SCHEDULER_H_
