// The KV cache's pages as a serving engine hands them out: a free list.
// A request takes pages as its tokens arrive and returns all of them when it
// finishes, so after a while a sequence's pages are scattered in the cache.
#ifndef RPA_TOOLS_DEMO_PAGE_ALLOCATOR_H_
#define RPA_TOOLS_DEMO_PAGE_ALLOCATOR_H_

#include <cstdint>
#include <vector>

namespace rpa::tools {

class PageAllocator {
 public:
  // Pages [0, num_pages), first handed out in a random order (seeded): a
  // cache that has been serving for a while is fragmented.
  PageAllocator(int32_t num_pages, uint64_t seed);

  int32_t num_pages() const { return num_pages_; }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  // Throws std::logic_error when none is free (the scheduler reserves
  // pages before admitting a request, so that is a bug).
  int32_t Allocate();
  // Throws std::logic_error for a page that is not allocated (a double free).
  void Free(int32_t page);

 private:
  int32_t num_pages_;
  std::vector<int32_t> free_;   // Last in, first out: a freed page is reused next.
  std::vector<bool> in_use_;
};

}  // namespace rpa::tools

#endif  // RPA_TOOLS_DEMO_PAGE_ALLOCATOR_H_
