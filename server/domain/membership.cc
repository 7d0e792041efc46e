#include "server/domain/membership.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/domain/bounded_text.h"
#include "server/domain/job_spec.h"

namespace syncnorm {

bool operator==(const MembershipChange& a, const MembershipChange& b) {
  return a.version == b.version && a.step == b.step && a.members == b.members &&
         a.joined == b.joined && a.left == b.left && a.removed == b.removed &&
         a.restored == b.restored;
}

Membership::Membership(int world_size, absl::Span<const int> members)
    : world_size_(world_size) {
  MembershipChange first;
  first.members = members.empty() ? RankSet::Range(0, world_size - 1)
                                  : RankSet::Of(members);
  history_.push_back(std::move(first));
  Index();
}

Membership Membership::FromHistory(int world_size,
                                   std::vector<MembershipChange> history) {
  Membership m;
  m.world_size_ = world_size;
  m.history_ = std::move(history);
  m.Index();
  return m;
}

void Membership::Index() {
  everyone_ = std::all_of(history_.begin(), history_.end(),
                          [&](const MembershipChange& c) {
                            return c.members.size() == world_size_;
                          });
}

const MembershipChange& Membership::At(int64_t step) const {
  // The newest change whose step is at or before `step`.
  for (auto it = history_.rbegin(); it != history_.rend(); ++it) {
    if (it->step <= step) return *it;
  }
  return history_.front();
}

bool Membership::IsMember(int rank, int64_t step) const {
  if (everyone_) return rank >= 0 && rank < world_size_;
  return At(step).members.contains(rank);
}

bool Membership::Excused(int rank, int64_t step) const {
  for (auto it = history_.rbegin(); it != history_.rend() && it->step > step;
       ++it) {
    if (it->removed.contains(rank)) return true;
  }
  return false;
}

bool Membership::OwesRounds(int rank, int64_t committed_step) const {
  for (auto it = history_.rbegin(); it != history_.rend(); ++it) {
    if (it->removed.contains(rank)) return false;
    if (it->left.contains(rank)) return it->step > committed_step;
  }
  return false;
}

absl::StatusOr<Membership> Membership::Apply(const MembershipRequest& request,
                                             int world_size, int64_t next_step,
                                             int64_t committed_step,
                                             const std::string& job_id) const {
  const std::string job = absl::StrCat("job '", BoundedText(job_id), "'");
  std::set<int> named;
  const auto check = [&](const std::vector<int>& ranks,
                         const char* what) -> absl::Status {
    for (int r : ranks) {
      if (r < 0 || r >= world_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " rank ", r, " is out of range: ", job, " has world_size ",
            world_size, " (ranks 0..", world_size - 1,
            "; a rank that may join later must be below world_size)"));
      }
      if (!named.insert(r).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r,
                         " is named twice; name each rank once over join, "
                         "leave and remove"));
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status s = check(request.join, "join"); !s.ok()) return s;
  if (absl::Status s = check(request.leave, "leave"); !s.ok()) return s;
  if (absl::Status s = check(request.remove, "remove"); !s.ok()) return s;
  if (named.empty()) {
    return absl::InvalidArgumentError(
        "the change names no rank; give ranks to join, leave or remove");
  }
  if (absl::Status s = CheckStep(request.step, "step"); !s.ok()) return s;

  // What the request changes, each O(ranks named x log runs); the members
  // after it, O(runs): never a pass over the job's width or its history.
  const MembershipChange& latest = this->latest();
  const RankSet& members = latest.members;
  std::vector<int> joined, left, removed;
  for (int r : request.join) {
    if (!members.contains(r)) joined.push_back(r);
  }
  for (int r : request.leave) {
    if (members.contains(r)) left.push_back(r);
  }
  for (int r : request.remove) {
    if (members.contains(r) || OwesRounds(r, committed_step)) {
      removed.push_back(r);
    }
  }
  if (joined.empty() && left.empty() && removed.empty()) {
    return *this;  // in force already: a retry
  }
  MembershipChange next;
  next.step = request.step == 0 ? next_step : request.step;
  if (next.step < next_step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", next.step, " is too early: a layer of ", job,
        " has completed step ", next_step - 1, " already; name step ",
        next_step, " or later (or 0 for the next)"));
  }
  if (next.step < latest.step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", next.step, " is before the latest membership change of ", job,
        " (version ", latest.version, " from step ", latest.step,
        "); changes apply in step order"));
  }
  std::sort(joined.begin(), joined.end());
  std::sort(left.begin(), left.end());
  std::sort(removed.begin(), removed.end());
  next.joined = RankSet::Of(joined);
  next.left = RankSet::Of(left);
  next.removed = RankSet::Of(removed);
  next.members = RankSet::Difference(
      RankSet::Difference(RankSet::Union(members, next.joined), next.left),
      next.removed);
  if (next.members.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the change would leave ", job,
        " without members; keep at least one rank (or delete the job)"));
  }
  next.version = latest.version + 1;
  Membership out = *this;
  out.applied_ = next;
  // A change for the step of the latest one (a Join's ranks running out
  // at one step, each leaving on its own) replaces it, as one version that
  // changes both's ranks: no round sees the latest alone (a round of that
  // step takes the members in force when it ends). Otherwise hundreds of
  // ranks leaving at one step would need as many kept changes.
  if (history_.size() >= 2 && next.step == latest.step && !latest.restored) {
    const RankSet& before = history_[history_.size() - 2].members;
    next.removed = RankSet::Difference(
        RankSet::Union(latest.removed, next.removed), next.members);
    next.joined = RankSet::Difference(next.members, before);
    next.left = RankSet::Difference(RankSet::Difference(before, next.members),
                                    next.removed);
    out.history_.back() = std::move(next);
  } else {
    out.history_.push_back(std::move(next));
  }
  out.Fold(committed_step);
  if (out.history_.size() > static_cast<size_t>(kMaxHistory)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        job, " has ", kMaxHistory,
        " membership changes for steps after its committed step ",
        committed_step, "; let training pass them before changing again"));
  }
  out.Index();
  return out;
}

Membership Membership::Restored(int64_t step, const RankSet& members,
                                int64_t committed_step) const {
  const RankSet& before = At(step + 1).members;
  if (before == members && latest().step <= step + 1) return *this;
  Membership out = *this;
  while (out.history_.size() > 1 && out.history_.back().step > step + 1) {
    out.history_.pop_back();
  }
  out.applied_.reset();
  MembershipChange next;
  next.version = latest().version + 1;
  next.step = step + 1;
  next.joined = RankSet::Difference(members, before);
  next.left = RankSet::Difference(before, members);
  next.members = members;
  next.restored = true;
  out.history_.push_back(std::move(next));
  out.Fold(committed_step);
  // A restore is never refused for the history's size: the oldest go.
  while (out.history_.size() > static_cast<size_t>(kMaxHistory)) {
    out.history_.erase(out.history_.begin());
  }
  out.Index();
  return out;
}

void Membership::Fold(int64_t committed_step) {
  // history_[0] stands for the steps before history_[1]; once every layer
  // has passed history_[1]'s step, history_[1] can stand for them instead.
  while (history_.size() > static_cast<size_t>(kMaxHistory) &&
         history_[1].step <= committed_step) {
    history_.erase(history_.begin());
  }
}

}  // namespace syncnorm
