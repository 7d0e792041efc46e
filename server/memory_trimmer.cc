#include "server/memory_trimmer.h"

#include <algorithm>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace syncnorm {

namespace {

struct Heap {
  int64_t in_use = 0;
  int64_t free = 0;
};

// Every arena's, from glibc's accounting; zeros without glibc. Takes each
// arena's lock briefly.
Heap ReadHeap() {
  Heap heap;
#if defined(__GLIBC__)
  const struct mallinfo2 info = mallinfo2();
  heap.in_use = static_cast<int64_t>(info.uordblks);
  heap.free = static_cast<int64_t>(info.fordblks);
#endif
  return heap;
}

}  // namespace

MemoryTrimmer::MemoryTrimmer(absl::Duration period)
    : thread_(std::max(period / kSamples, absl::Milliseconds(1)),
              [this] { Tick(); }) {}

MemoryTrimmer::~MemoryTrimmer() = default;

void MemoryTrimmer::Tick() {
  const Heap heap = ReadHeap();
  int64_t& peak = peaks_[period_ % kWindow];
  peak = std::max(peak, heap.in_use);
  if (++ticks_ % kSamples != 0) return;
  const int64_t recent = *std::max_element(peaks_.begin(), peaks_.end());
  ++period_;
  peaks_[period_ % kWindow] = 0;
#if defined(__GLIBC__)
  // Releases free pages of every arena, not only the top of the main heap.
  if (heap.free > recent) malloc_trim(0);
#endif
}

}  // namespace syncnorm
