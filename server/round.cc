#include "server/round.h"

#include <utility>

namespace syncnorm {

Round::Round(int first_rank, int group_size, absl::Time deadline)
    : first_rank_(first_rank), deadline_(deadline), payloads_(group_size) {}

Round::AddResult Round::Add(int rank, Payload payload, RoundCallback&& done) {
  std::optional<Payload>& slot = payloads_[rank - first_rank_];
  if (slot.has_value()) {
    if (!SamePayload(*slot, payload)) return AddResult::kConflict;
    waiters_.push_back(std::move(done));
    return AddResult::kDuplicate;
  }
  slot = std::move(payload);
  ++received_;
  waiters_.push_back(std::move(done));
  return AddResult::kAdded;
}

std::vector<int> Round::MissingRanks() const {
  std::vector<int> missing;
  for (size_t i = 0; i < payloads_.size(); ++i) {
    if (!payloads_[i].has_value()) {
      missing.push_back(first_rank_ + static_cast<int>(i));
    }
  }
  return missing;
}

Moments Round::MergedMoments(int channels) const {
  // Rank order, always: the Chan merge is not associative in floating point,
  // so a fixed order is what makes every arrival order give the same bits.
  Moments acc = Moments::Zero(channels);
  for (const std::optional<Payload>& p : payloads_) {
    MergeMoments(acc, std::get<Moments>(*p));
  }
  return acc;
}

GradSums Round::SummedGradSums(int channels) const {
  GradSums acc;
  acc.sum_dy.assign(channels, 0.0);
  acc.sum_dy_xmu.assign(channels, 0.0);
  for (const std::optional<Payload>& p : payloads_) {
    AddGradSums(acc, std::get<GradSums>(*p));
  }
  return acc;
}

std::vector<std::optional<uint64_t>> Round::Fingerprints() const {
  std::vector<std::optional<uint64_t>> out(payloads_.size());
  for (size_t i = 0; i < payloads_.size(); ++i) {
    if (payloads_[i].has_value()) out[i] = PayloadFingerprint(*payloads_[i]);
  }
  return out;
}

std::vector<RoundCallback> Round::TakeWaiters() {
  std::vector<RoundCallback> out;
  out.swap(waiters_);
  return out;
}

}  // namespace syncnorm
