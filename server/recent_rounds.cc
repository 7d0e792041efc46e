#include "server/recent_rounds.h"

#include <algorithm>
#include <utility>

namespace syncnorm {

void RecentRounds::Add(Entry entry) {
  entries_.push_back(std::move(entry));
  if (entries_.size() <= capacity_) return;
  auto oldest = std::min_element(
      entries_.begin(), entries_.end(),
      [](const Entry& a, const Entry& b) { return a.step < b.step; });
  entries_.erase(oldest);
}

const RecentRounds::Entry* RecentRounds::Find(int64_t step) const {
  for (const Entry& e : entries_) {
    if (e.step == step) return &e;
  }
  return nullptr;
}

}  // namespace syncnorm
