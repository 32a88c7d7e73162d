#include "demo/page_allocator.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

namespace rpa::tools {

PageAllocator::PageAllocator(int32_t num_pages, uint64_t seed)
    : num_pages_(num_pages), free_(static_cast<size_t>(num_pages)),
      in_use_(static_cast<size_t>(num_pages), false) {
  std::iota(free_.begin(), free_.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(free_.begin(), free_.end(), rng);
}

int32_t PageAllocator::Allocate() {
  if (free_.empty()) throw std::logic_error("PageAllocator: no free page");
  const int32_t page = free_.back();
  free_.pop_back();
  in_use_[static_cast<size_t>(page)] = true;
  return page;
}

void PageAllocator::Free(int32_t page) {
  if (page < 0 || page >= num_pages_ || !in_use_[static_cast<size_t>(page)]) {
    throw std::logic_error("PageAllocator: page " + std::to_string(page) + " is not allocated");
  }
  in_use_[static_cast<size_t>(page)] = false;
  free_.push_back(page);
}

}  // namespace rpa::tools
