#include "server/memory_trimmer.h"

#include <algorithm>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "server/rpc/read_flood.h"

namespace syncnorm {

bool TrimPolicy::Sample(int64_t resident, int64_t in_use) {
  constexpr int kPeriods = 2 * kWindow;
  Period& now = periods_[period_ % kPeriods];
  if (forgetting_ == 0) now.most_in_use = std::max(now.most_in_use, in_use);
  now.least_beyond = std::min(now.least_beyond, resident - in_use);
  if (++samples_ % kSamples != 0) return false;
  int64_t set = 0;
  int64_t beyond = INT64_MAX;
  for (int back = 0; back < kPeriods; ++back) {
    const Period& p = periods_[(period_ - back + kPeriods) % kPeriods];
    if (back < kWindow) set = std::max(set, p.most_in_use);
    beyond = std::min(beyond, p.least_beyond);
  }
  ++period_;
  periods_[period_ % kPeriods] = Period{};
  if (forgetting_ > 0) --forgetting_;
  return resident > beyond + set + set / 4;
}

void TrimPolicy::Forget() {
  for (Period& p : periods_) p.most_in_use = 0;
  forgetting_ = kForgetPeriods;
}

MemoryTrimmer::MemoryTrimmer(absl::Duration period)
    : thread_(std::max(period / TrimPolicy::kSamples, absl::Milliseconds(1)),
              [this] { Tick(); }) {}

MemoryTrimmer::~MemoryTrimmer() = default;

void MemoryTrimmer::Tick() {
  if (forget_.exchange(false, std::memory_order_relaxed)) policy_.Forget();
  int64_t in_use = 0;
#if defined(__GLIBC__)
  const struct mallinfo2 info = mallinfo2();
  in_use = static_cast<int64_t>(info.uordblks + info.hblkhd);
#endif
  // Releases free pages of every arena, not only the top of the main heap.
  if (policy_.Sample(ReadProcessMemory().resident, in_use)) {
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
  }
}

}  // namespace syncnorm
