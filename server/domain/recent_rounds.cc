#include "server/domain/recent_rounds.h"

#include <utility>

namespace syncnorm {

void RecentRounds::Add(Entry entry) {
  entries_.push_back(std::move(entry));
  if (entries_.size() > capacity_) entries_.erase(entries_.begin());
}

const RecentRounds::Entry* RecentRounds::Find(int64_t step,
                                              int backward) const {
  for (const Entry& e : entries_) {
    if (e.step == step && e.backward == backward) return &e;
  }
  return nullptr;
}

}  // namespace syncnorm
