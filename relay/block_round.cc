#include "relay/block_round.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/moments.h"
#include "kernels/round_update.h"
#include "server/domain/contribution.h"
#include "server/domain/merge_tree.h"
#include "wire/convert.h"

namespace syncnorm {
namespace {

bool AllFinite(const google::protobuf::RepeatedField<double>& v) {
  return std::all_of(v.begin(), v.end(),
                     [](double x) { return std::isfinite(x); });
}

// The payload of `c` for MergeTree; FAILED_PRECONDITION unless it is the
// phase's kind, `channels` wide (set from the first one when 0), finite,
// with a count >= 0. The shard judges such a payload rank by rank, so the
// block goes through unmerged.
absl::StatusOr<Payload> PayloadOf(const v1::Contribution& c, int& channels) {
  if (c.phase() == v1::FORWARD && c.has_moments()) {
    const v1::Moments& m = c.moments();
    if (channels == 0) channels = m.mean_size();
    if (m.mean_size() == channels && m.m2_size() == channels &&
        m.count() >= 0 && AllFinite(m.mean()) && AllFinite(m.m2()) &&
        std::all_of(m.m2().begin(), m.m2().end(),
                    [](double x) { return x >= 0; })) {
      return Payload(FromProto(m));
    }
  } else if (c.phase() == v1::BACKWARD && c.has_grad_sums()) {
    const v1::GradSums& g = c.grad_sums();
    if (channels == 0) channels = g.sum_dy_size();
    if (g.sum_dy_size() == channels && g.sum_dy_xmu_size() == channels &&
        AllFinite(g.sum_dy()) && AllFinite(g.sum_dy_xmu())) {
      return Payload(FromProto(g));
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("rank ", c.rank(), "'s payload is for the shard to judge"));
}

}  // namespace

BlockRound::BlockRound(std::vector<int> position_ranks,
                       std::vector<int> members, int first_position,
                       int positions, absl::Time first_arrival)
    : position_ranks_(std::move(position_ranks)),
      members_(std::move(members)),
      first_position_(first_position),
      positions_(positions),
      first_arrival_(first_arrival) {}

BlockRound::Added BlockRound::Add(v1::Contribution& c, AnswerFn& done) {
  if (std::find(members_.begin(), members_.end(), c.rank()) == members_.end()) {
    return Added::kRefused;
  }
  auto it = held_.find(c.rank());
  if (it == held_.end()) {
    HeldContribution& h = held_[c.rank()];
    h.contribution = std::move(c);
    h.waiters.push_back(std::move(done));
    return Added::kHeld;
  }
  if (forwarded_ ||
      it->second.contribution.SerializeAsString() != c.SerializeAsString()) {
    return Added::kRefused;
  }
  it->second.waiters.push_back(std::move(done));
  return Added::kHeld;
}

absl::StatusOr<v1::Contribution> BlockRound::Merge() const {
  const v1::Contribution& first = held_.at(members_.front()).contribution;
  const RoundUpdate update = RoundUpdateFromProto(first);
  int channels = 0;
  MergeTree tree(position_ranks_);
  tree.Reset([this](int i) {
    return std::find(members_.begin(), members_.end(), position_ranks_[i]) !=
           members_.end();
  });
  v1::RelayBlock block;
  block.set_first_position(first_position_);
  block.set_positions(positions_);
  for (size_t i = 0; i < position_ranks_.size(); ++i) {
    auto it = held_.find(position_ranks_[i]);
    if (it == held_.end()) continue;  // no member at this step
    const v1::Contribution& c = it->second.contribution;
    if (!SameUpdate(RoundUpdateFromProto(c), update)) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", c.rank(), "'s round update differs from rank ",
                       first.rank(), "'s"));
    }
    absl::StatusOr<Payload> payload = PayloadOf(c, channels);
    if (!payload.ok()) return payload.status();
    // Computed as the shard computes a direct contribution's, so that a
    // rank's retry through any path matches it.
    block.add_fingerprints(ContributionFingerprint(*payload, update));
    tree.Add(static_cast<int>(i), *std::move(payload));
  }
  block.set_fingerprint_kind(static_cast<int>(kFingerprintKind));
  // The members as maximal (first, last) runs, ascending.
  std::vector<int> ranks = members_;
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    block.add_rank_runs(ranks[i]);
    block.add_rank_runs(ranks[j]);
    i = j + 1;
  }

  v1::Contribution out;
  out.set_job_id(first.job_id());
  out.set_layer(first.layer());
  out.set_step(first.step());
  out.set_phase(first.phase());
  out.set_backward_index(first.backward_index());
  out.set_rank(members_.front());
  if (first.phase() == v1::FORWARD) {
    absl::StatusOr<Moments> merged = tree.MergedMoments(channels);
    if (!merged.ok()) {
      return absl::FailedPreconditionError(merged.status().message());
    }
    ToProto(*merged, *out.mutable_moments());
  } else {
    ToProto(tree.SummedGradSums(channels), *out.mutable_grad_sums());
  }
  ToProto(update, out);
  *out.mutable_relay() = std::move(block);
  return out;
}

}  // namespace syncnorm
