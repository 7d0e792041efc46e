#include "server/domain/round.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "wire/rank_list.h"

namespace syncnorm {

namespace {

std::vector<int> Consecutive(int first_rank, int group_size) {
  std::vector<int> ranks(group_size);
  for (int i = 0; i < group_size; ++i) ranks[i] = first_rank + i;
  return ranks;
}

}  // namespace

Round::Round(std::vector<int> ranks, absl::Time deadline)
    : ranks_(std::move(ranks)),
      deadline_(deadline),
      slots_(ranks_.size()),
      tree_(ranks_),
      fingerprints_(ranks_.size()),
      awaited_(ranks_.size()),
      members_(static_cast<int>(ranks_.size())) {
  waiters_.reserve(ranks_.size());
}

void Round::SetRoles(absl::FunctionRef<Role(int rank)> role_of,
                     std::vector<RoundCallback>& dropped,
                     std::vector<RoundCallback>& evicted_blocks) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].role = role_of(ranks_[i]);
  }
  if (!blocks_.empty()) EvictChangedBlocks(evicted_blocks);
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    if (slot.role != Role::kOutside || !slot.sent) continue;
    slot.sent = false;
    slot.update.momentum.reset();
    slot.update.imported.reset();
    slot.arrival = absl::InfiniteFuture();
    fingerprints_[i].reset();
    --received_;
    const int index = static_cast<int>(i);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->index != index) {
        ++it;
        continue;
      }
      dropped.push_back(std::move(it->done));
      it = waiters_.erase(it);
    }
    slot.waiting = 0;
  }
  tree_.Reset([&](int i) { return slots_[i].role != Role::kOutside; });
  awaited_ = 0;
  members_ = 0;
  first_arrival_ = absl::InfiniteFuture();
  for (const Slot& slot : slots_) {
    if (slot.role != Role::kOutside) ++members_;
    if (slot.role == Role::kMember && !slot.sent) ++awaited_;
    if (slot.sent) {
      first_arrival_ = std::min(first_arrival_, slot.arrival);
    }
  }
}

int Round::BlockEnd(int first, int positions) const {
  return static_cast<int>(std::min<int64_t>(
      int64_t{first} + positions, static_cast<int64_t>(ranks_.size())));
}

bool Round::OtherMembers(int first, int end,
                         absl::Span<const int> ranks) const {
  size_t k = 0;
  for (int p = first; p < end; ++p) {
    if (slots_[p].role == Role::kOutside) continue;
    if (k == ranks.size() || ranks[k] != ranks_[p]) return true;
    ++k;
  }
  return k != ranks.size();
}

void Round::EvictChangedBlocks(std::vector<RoundCallback>& evicted_blocks) {
  for (auto b = blocks_.begin(); b != blocks_.end();) {
    const int end = BlockEnd(b->first, b->positions);
    if (!OtherMembers(b->first, end, b->ranks)) {
      ++b;
      continue;
    }
    for (int p = b->first; p < end; ++p) {
      Slot& slot = slots_[p];
      if (!slot.via_block) continue;
      slot.via_block = false;
      slot.sent = false;
      slot.update = RoundUpdate();
      slot.arrival = absl::InfiniteFuture();
      fingerprints_[p].reset();
      --received_;
    }
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (!it->block || it->index < b->first || it->index >= end) {
        ++it;
        continue;
      }
      evicted_blocks.push_back(std::move(it->done));
      --slots_[it->index].waiting;
      it = waiters_.erase(it);
    }
    tree_.RemoveBlock(b->first, b->positions);
    b = blocks_.erase(b);
  }
}

Round::Round(int first_rank, int group_size, absl::Time deadline)
    : Round(Consecutive(first_rank, group_size), deadline) {}

int Round::IndexOf(int rank) const {
  return static_cast<int>(std::lower_bound(ranks_.begin(), ranks_.end(), rank) -
                          ranks_.begin());
}

void Round::Wait(int index, bool block, RoundCallback&& done,
                 RoundCallback* evicted) {
  if (done == nullptr) return;
  Slot& slot = slots_[index];
  if (slot.waiting >= kMaxWaitersPerRank) {
    auto oldest =
        std::find_if(waiters_.begin(), waiters_.end(),
                     [&](const Waiter& w) { return w.index == index; });
    *evicted = std::move(oldest->done);
    waiters_.erase(oldest);
    --slot.waiting;
  }
  waiters_.push_back(Waiter{index, std::move(done), block});
  ++slot.waiting;
}

Round::AddResult Round::Add(int rank, Payload payload, RoundUpdate update,
                            RoundCallback&& done, absl::Time now,
                            RoundCallback* evicted) {
  const int index = IndexOf(rank);
  Slot& slot = slots_[index];
  *evicted = nullptr;
  if (slot.sent) {
    // A rank a relay's block sent is known by its fingerprint only.
    const bool same =
        slot.via_block
            ? fingerprints_[index] == ContributionFingerprint(payload, update)
            : SamePayload(*tree_.Leaf(index), payload) &&
                  SameUpdate(slot.update, update);
    if (!same) return AddResult::kConflict;
    Wait(index, /*block=*/false, std::move(done), evicted);
    return AddResult::kDuplicate;
  }
  // The contributing thread hashes its own payload, so the thread that
  // completes the round does not hash everyone's.
  fingerprints_[index] = ContributionFingerprint(payload, update);
  tree_.Add(index, std::move(payload));
  slot.sent = true;
  slot.update = std::move(update);
  slot.arrival = now;
  first_arrival_ = std::min(first_arrival_, now);
  ++received_;
  if (slot.role == Role::kMember) --awaited_;
  Wait(index, /*block=*/false, std::move(done), evicted);
  return AddResult::kAdded;
}

absl::StatusOr<Round::AddResult> Round::AddBlock(
    const RelayBlock& block, Payload payload, const RoundUpdate& update,
    RoundCallback&& done, absl::Time now, RoundCallback* evicted,
    int* conflict) {
  *evicted = nullptr;
  *conflict = -1;
  const int size = static_cast<int>(ranks_.size());
  const int first = block.first_position;
  const int end = BlockEnd(first, block.positions);
  if (first >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("relay block at positions [", first, ", ",
                     int64_t{first} + block.positions,
                     ") is outside its group of ", size, " ranks"));
  }
  if (OtherMembers(first, end, block.ranks)) {
    std::vector<int> members;
    for (int p = first; p < end; ++p) {
      if (slots_[p].role != Role::kOutside) members.push_back(ranks_[p]);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("relay block at positions [", first, ", ",
                     int64_t{first} + block.positions, ") merges ranks ",
                     RankList(block.ranks), " but its members at the step are ",
                     RankList(members),
                     ": a relay merges exactly a block's members, and "
                     "passes the ranks through when they changed"));
  }
  bool recorded = true;
  size_t k = 0;
  for (int p = first; p < end; ++p) {
    if (slots_[p].role == Role::kOutside) continue;
    if (!slots_[p].sent) {
      recorded = false;
    } else if (fingerprints_[p] != block.fingerprints[k]) {
      *conflict = ranks_[p];
      return AddResult::kConflict;
    }
    ++k;
  }
  const int index = IndexOf(block.ranks.front());
  if (recorded) {
    Wait(index, /*block=*/true, std::move(done), evicted);
    return AddResult::kDuplicate;
  }
  k = 0;
  for (int p = first; p < end; ++p) {
    Slot& slot = slots_[p];
    if (slot.role == Role::kOutside) continue;
    if (!slot.sent) {
      slot.sent = true;
      slot.arrival = now;
      ++received_;
      if (slot.role == Role::kMember) --awaited_;
    }
    slot.via_block = true;
    slot.update = update;
    fingerprints_[p] = block.fingerprints[k++];
  }
  first_arrival_ = std::min(first_arrival_, now);
  // A block inside this one (a lower relay's) is now part of it: its
  // waiters stay, and go with this block if it is evicted.
  blocks_.erase(std::remove_if(blocks_.begin(), blocks_.end(),
                               [&](const Block& b) {
                                 return b.first >= first && b.first < end;
                               }),
                blocks_.end());
  tree_.AddBlock(first, block.positions, static_cast<int>(block.ranks.size()),
                 block.ranks.front(), std::move(payload));
  blocks_.push_back(Block{first, block.positions, block.ranks});
  Wait(index, /*block=*/true, std::move(done), evicted);
  return AddResult::kAdded;
}

std::vector<int> Round::MissingRanks() const {
  std::vector<int> missing;
  missing.reserve(slots_.size() - received_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].sent && slots_[i].role != Role::kOutside) {
      missing.push_back(ranks_[i]);
    }
  }
  return missing;
}

std::vector<int> Round::PresentRanks() const {
  std::vector<int> present;
  present.reserve(received_);  // a report per round asks for them
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].sent) {
      present.push_back(ranks_[i]);
    }
  }
  return present;
}

std::vector<int> Round::Stragglers(absl::Duration threshold) const {
  std::vector<std::pair<absl::Time, int>> late;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.sent && s.arrival - first_arrival_ > threshold) {
      late.emplace_back(s.arrival, ranks_[i]);
    }
  }
  std::sort(late.begin(), late.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<int> out;
  for (const auto& [time, rank] : late) out.push_back(rank);
  return out;
}

absl::Duration Round::LastArrival() const {
  absl::Duration last = absl::ZeroDuration();
  for (const Slot& s : slots_) {
    if (s.sent) {
      last = std::max(last, s.arrival - first_arrival_);
    }
  }
  return last;
}

absl::StatusOr<Moments> Round::MergedMoments(int channels) {
  return tree_.MergedMoments(channels);
}

void Round::TakeMoments(std::vector<int>& ranks,
                        std::vector<Moments>& moments) {
  tree_.TakeMoments(ranks, moments);
}

GradSums Round::SummedGradSums(int channels) {
  return tree_.SummedGradSums(channels);
}

absl::StatusOr<RoundUpdate> Round::AgreedUpdate() const {
  const RoundUpdate* first = nullptr;
  int first_rank = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].sent) continue;
    if (first == nullptr) {
      first = &slots_[i].update;
      first_rank = ranks_[i];
    } else if (!SameUpdate(*first, slots_[i].update)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", ranks_[i],
          " sent a different momentum or imported_stats "
          "than rank ",
          first_rank,
          ": every rank of a group must change the "
          "layer alike (the same momentum; the same statistics after "
          "load_state_dict, reset_running_stats or a write to the buffers)"));
    }
  }
  return *first;
}

const std::vector<std::optional<uint64_t>>& Round::Fingerprints() const {
  return fingerprints_;
}

std::vector<std::optional<uint64_t>> Round::TakeFingerprints() {
  return std::move(fingerprints_);
}

std::vector<RoundCallback> Round::TakeWaiters() {
  std::vector<RoundCallback> out;
  out.reserve(waiters_.size());
  TakeWaiters([&](RoundCallback&& done) { out.push_back(std::move(done)); });
  return out;
}

void Round::TakeWaiters(absl::FunctionRef<void(RoundCallback&&)> take) {
  for (Waiter& w : waiters_) take(std::move(w.done));
  waiters_.clear();
  for (Slot& s : slots_) s.waiting = 0;
}

}  // namespace syncnorm
