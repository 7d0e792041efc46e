#include "relay/job_view.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace syncnorm {
namespace {

// A change's members: its runs, or its list from a server written before
// runs.
absl::StatusOr<RankSet> MembersOf(const v1::MembershipChange& change,
                                  int world_size) {
  if (change.member_runs_size() > 0 || change.members_size() == 0) {
    return RankSet::FromFlatRuns(change.member_runs(), world_size);
  }
  std::vector<int> ranks(change.members().begin(), change.members().end());
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return RankSet::Of(ranks);
}

}  // namespace

absl::StatusOr<JobView> JobView::FromProto(const v1::JobInfo& info) {
  JobView v;
  v.world_size_ = info.world_size();
  if (v.world_size_ <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job ", info.job_id(), " has world_size ", info.world_size()));
  }
  v.group_size_ = info.group_size();
  if (info.groups_size() > 0) {
    v.group_size_ = 0;
    v.group_of_.assign(v.world_size_, -1);
    v.position_of_.assign(v.world_size_, -1);
    for (int g = 0; g < info.groups_size(); ++g) {
      std::vector<int> ranks(info.groups(g).ranks().begin(),
                             info.groups(g).ranks().end());
      for (size_t i = 0; i < ranks.size(); ++i) {
        const int r = ranks[i];
        if (r < 0 || r >= v.world_size_ || v.group_of_[r] >= 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("job ", info.job_id(), ": group ", g, " names rank ",
                           r, " outside the job or twice"));
        }
        v.group_of_[r] = g;
        v.position_of_[r] = static_cast<int>(i);
      }
      v.groups_.push_back(std::move(ranks));
    }
  } else if (v.group_size_ <= 0 || v.world_size_ % v.group_size_ != 0) {
    v.group_size_ = v.world_size_;
  }
  for (const v1::MembershipChange& change : info.membership().history()) {
    absl::StatusOr<RankSet> members = MembersOf(change, v.world_size_);
    if (!members.ok()) return members.status();
    absl::StatusOr<RankSet> removed =
        RankSet::FromFlatRuns(change.removed_runs(), v.world_size_);
    if (!removed.ok()) return removed.status();
    v.changes_.push_back(
        Change{change.step(), *std::move(members), *std::move(removed)});
  }
  v.accepts_relay_blocks_ = info.accepts_relay_blocks();
  v.staleness_ = info.staleness();
  v.next_step_ = info.next_step();
  v.round_timeout_ = absl::Milliseconds(info.round_timeout_ms());
  if (info.has_quorum() && info.quorum().min_ranks() > 0) {
    v.quorum_grace_ = absl::Milliseconds(info.quorum().grace_ms());
  }
  return v;
}

std::optional<RankPlace> JobView::Place(int rank, int block_positions) const {
  if (rank < 0 || rank >= world_size_) return std::nullopt;
  RankPlace p;
  if (group_size_ > 0) {
    p.group = rank / group_size_;
    p.position = rank % group_size_;
  } else {
    p.group = group_of_[rank];
    p.position = position_of_[rank];
    if (p.group < 0) return std::nullopt;
  }
  p.block = p.position / block_positions;
  return p;
}

std::vector<int> JobView::PositionRanks(int group, int first, int count) const {
  std::vector<int> out;
  const int size =
      group_size_ > 0 ? group_size_ : static_cast<int>(groups_[group].size());
  for (int i = first; i < first + count && i < size; ++i) {
    out.push_back(group_size_ > 0 ? group * group_size_ + i
                                  : groups_[group][i]);
  }
  return out;
}

bool JobView::IsMember(int rank, int64_t step) const {
  if (changes_.empty()) return rank >= 0 && rank < world_size_;
  // The latest change from `step` on, or the oldest kept, which stands for
  // every step before it.
  const Change* in_force = &changes_.front();
  for (const Change& c : changes_) {
    if (c.step <= step) in_force = &c;
  }
  return in_force->members.contains(rank);
}

bool JobView::RemovedAfter(int rank, int64_t step) const {
  for (const Change& c : changes_) {
    if (c.step > step && c.removed.contains(rank)) return true;
  }
  return false;
}

}  // namespace syncnorm
