#include "demo/scheduler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace rpa::tools {

Scheduler::Scheduler(std::vector<Request> requests, const SchedulerLimits& limits,
                     PageAllocator& pages)
    : requests_(std::move(requests)), limits_(limits), pages_(pages) {
  if (limits_.max_running < 1 || limits_.token_budget < limits_.max_running ||
      limits_.page_size < 1) {
    throw std::invalid_argument(
        "Scheduler: need 1 <= max_running <= token_budget and page_size >= 1 (every running "
        "request decodes one token per step)");
  }
  for (size_t i = 0; i < requests_.size(); ++i) {
    const Request& r = requests_[i];
    if (r.id != static_cast<int>(i)) {
      throw std::invalid_argument("Scheduler: request ids must be 0, 1, ... in order");
    }
    if (r.prompt_len < 1 || r.output_len < 1 || PagesNeeded(r) > pages_.num_pages()) {
      throw std::invalid_argument(
          "Scheduler: request " + std::to_string(r.id) + " (prompt " +
          std::to_string(r.prompt_len) + ", output " + std::to_string(r.output_len) +
          " tokens) needs " + std::to_string(PagesNeeded(r)) + " pages; the cache has " +
          std::to_string(pages_.num_pages()) + ". Give it more pages or shorter requests.");
    }
  }
}

int32_t Scheduler::PagesFor(int32_t tokens) const {
  return (tokens + limits_.page_size - 1) / limits_.page_size;
}

// The last output token is sampled but never fed back, so its K/V is never written.
int32_t Scheduler::PagesNeeded(const Request& r) const {
  return PagesFor(r.prompt_len + r.output_len - 1);
}

int32_t Scheduler::MaxPagesPerSeq() const {
  int32_t most = 1;
  for (const Request& r : requests_) most = std::max(most, PagesNeeded(r));
  return most;
}

int Scheduler::waiting() const {
  int count = 0;
  for (size_t i = next_arrival_; i < requests_.size() && requests_[i].arrival_step <= clock_; ++i) {
    ++count;
  }
  return count;
}

void Scheduler::Admit() {
  while (next_arrival_ < requests_.size() && requests_[next_arrival_].arrival_step <= clock_ &&
         running() < limits_.max_running) {
    const Request& r = requests_[next_arrival_];
    const int32_t need = PagesNeeded(r);
    if (pages_.num_free() - reserved_ < need) return;  // First come, first served: wait.
    Live live;
    live.request = r.id;
    live.reserved = need;
    reserved_ += need;
    running_.push_back(std::move(live));
    ++next_arrival_;
  }
}

void Scheduler::TakePages(Live& live, int32_t kv_len) {
  while (static_cast<int32_t>(live.pages.size()) < PagesFor(kv_len)) {
    live.pages.push_back(pages_.Allocate());
    --live.reserved;
    --reserved_;
  }
}

void Scheduler::Release(Live& live) {
  for (const int32_t page : live.pages) {
    pages_.Free(page);
    freed_.push_back(page);
  }
  reserved_ -= live.reserved;
  live.pages.clear();
}

const StepSchedule& Scheduler::Schedule() {
  schedule_ = StepSchedule{};
  scheduled_slots_.clear();
  Admit();
  if (running_.empty()) {
    if (next_arrival_ < requests_.size()) {
      clock_ = std::max(clock_, requests_[next_arrival_].arrival_step);  // Idle until then.
    }
    return schedule_;
  }
  int32_t budget = limits_.token_budget;
  auto add = [&](size_t slot, int32_t q_len, bool prefill) {
    Live& live = running_[slot];
    ScheduledSeq seq;
    seq.request = live.request;
    seq.q_len = q_len;
    seq.kv_len = live.cached + q_len;
    seq.prefill = prefill;
    TakePages(live, seq.kv_len);
    seq.pages = &live.pages;
    schedule_.seqs.push_back(seq);
    scheduled_slots_.push_back(slot);
    (prefill ? schedule_.prefill_tokens : schedule_.decode_tokens) += q_len;
    budget -= q_len;
  };
  for (size_t slot = 0; slot < running_.size(); ++slot) {
    if (running_[slot].cached >= requests_[running_[slot].request].prompt_len) add(slot, 1, false);
  }
  for (size_t slot = 0; slot < running_.size() && budget > 0; ++slot) {
    const int32_t prompt_left = requests_[running_[slot].request].prompt_len - running_[slot].cached;
    if (prompt_left > 0) add(slot, std::min(prompt_left, budget), true);
  }
  return schedule_;
}

const std::vector<int32_t>& Scheduler::Complete() {
  freed_.clear();
  for (size_t i = 0; i < schedule_.seqs.size(); ++i) {
    const ScheduledSeq& seq = schedule_.seqs[i];
    Live& live = running_[scheduled_slots_[i]];
    live.cached = seq.kv_len;
    // A prompt's last chunk samples the first output token; a decode step the next.
    if (!seq.prefill || live.cached == requests_[live.request].prompt_len) ++live.generated;
  }
  for (auto it = running_.begin(); it != running_.end();) {
    if (it->generated < requests_[it->request].output_len) {
      ++it;
      continue;
    }
    Release(*it);
    ++finished_;
    it = running_.erase(it);
  }
  schedule_ = StepSchedule{};
  scheduled_slots_.clear();
  ++clock_;
  return freed_;
}

}  // namespace rpa::tools
