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
                       int positions)
    : position_ranks_(std::move(position_ranks)),
      members_(std::move(members)),
      first_position_(first_position),
      positions_(positions),
      position_held_(position_ranks_.size(), false) {
  by_rank_.reserve(position_ranks_.size());
  for (size_t i = 0; i < position_ranks_.size(); ++i) {
    by_rank_.emplace_back(position_ranks_[i], static_cast<int>(i));
  }
  std::sort(by_rank_.begin(), by_rank_.end());
  // Both by position: one pass.
  position_member_.resize(position_ranks_.size(), false);
  size_t m = 0;
  for (size_t i = 0; i < position_ranks_.size() && m < members_.size(); ++i) {
    if (position_ranks_[i] == members_[m]) {
      position_member_[i] = true;
      ++m;
    }
  }
}

BlockRound::Added BlockRound::Resend(HeldContribution& held,
                                     const v1::Contribution& c,
                                     AnswerFn& done) const {
  if (forwarded_) return Added::kRefused;
  v1::Contribution a = held.contribution;
  v1::Contribution b = c;
  a.clear_round_age_ms();
  b.clear_round_age_ms();
  if (a.SerializeAsString() != b.SerializeAsString()) return Added::kRefused;
  held.waiters.push_back(std::move(done));
  return Added::kHeld;
}

bool BlockRound::BlockFits(const v1::Contribution& c, int& offset,
                           int& end) const {
  const v1::RelayBlock& b = c.relay();
  const int n = b.positions();
  // Aligned, a power of two, within this block (itself aligned).
  if (n <= 0 || n > positions_ || (n & (n - 1)) != 0 ||
      b.first_position() % n != 0 || b.first_position() < first_position_ ||
      b.first_position() - first_position_ >= positions_ ||
      b.fingerprint_kind() != static_cast<int>(kFingerprintKind)) {
    return false;
  }
  offset = b.first_position() - first_position_;
  end = std::min<int>(offset + n, static_cast<int>(position_ranks_.size()));
  // Its members here, by rank, none of them held yet; the first by
  // position is the block's rank.
  std::vector<int> expected;
  for (int i = offset; i < end; ++i) {
    if (!position_member_[i]) continue;
    if (position_held_[i]) return false;
    if (expected.empty() && position_ranks_[i] != c.rank()) return false;
    expected.push_back(position_ranks_[i]);
  }
  if (expected.empty() ||
      b.fingerprints_size() != static_cast<int>(expected.size()) ||
      b.rank_runs_size() % 2 != 0 ||
      b.rank_runs_size() > 2 * static_cast<int>(expected.size())) {
    return false;
  }
  std::sort(expected.begin(), expected.end());
  // The runs list exactly `expected`, ascending: a run is walked only as
  // far as `expected` goes.
  size_t k = 0;
  for (int i = 0; i < b.rank_runs_size(); i += 2) {
    const int first = b.rank_runs(i);
    const int last = b.rank_runs(i + 1);
    if (first > last) return false;
    for (int64_t r = first; r <= last; ++r) {
      if (k == expected.size() || expected[k] != r) return false;
      ++k;
    }
  }
  return k == expected.size();
}

BlockRound::Added BlockRound::Add(v1::Contribution& c, AnswerFn& done) {
  auto it = held_.find(c.rank());
  if (it != held_.end()) return Resend(it->second, c, done);
  int first = 0;
  int end = 0;
  if (c.has_relay()) {
    if (!BlockFits(c, first, end)) return Added::kRefused;
  } else {
    auto at = std::lower_bound(by_rank_.begin(), by_rank_.end(),
                               std::make_pair(c.rank(), 0));
    if (at == by_rank_.end() || at->first != c.rank()) return Added::kRefused;
    first = at->second;
    end = first + 1;
    if (!position_member_[first] || position_held_[first]) {
      return Added::kRefused;
    }
  }
  for (int i = first; i < end; ++i) {
    if (!position_member_[i]) continue;
    position_held_[i] = true;
    ++covered_;
  }
  HeldContribution& h = held_[c.rank()];
  h.contribution = std::move(c);
  h.waiters.push_back(std::move(done));
  return Added::kHeld;
}

absl::StatusOr<v1::Contribution> BlockRound::Merge() const {
  const v1::Contribution& first = held_.at(members_.front()).contribution;
  const RoundUpdate update = RoundUpdateFromProto(first);
  int channels = 0;
  MergeTree tree(position_ranks_);
  tree.Reset([this](int i) { return position_member_[i]; });
  v1::RelayBlock block;
  block.set_first_position(first_position_);
  block.set_positions(positions_);
  for (size_t i = 0; i < position_ranks_.size(); ++i) {
    // A held block's rank is its first member's: the walk meets it first.
    auto it = held_.find(position_ranks_[i]);
    if (it == held_.end()) continue;  // no member at this step, or blocked
    const v1::Contribution& c = it->second.contribution;
    if (!SameUpdate(RoundUpdateFromProto(c), update)) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", c.rank(), "'s round update differs from rank ",
                       first.rank(), "'s"));
    }
    absl::StatusOr<Payload> payload = PayloadOf(c, channels);
    if (!payload.ok()) return payload.status();
    if (c.has_relay()) {
      // A child's block, at its subtree's node, its fingerprints in their
      // place (Add checked its shape and members).
      const v1::RelayBlock& b = c.relay();
      block.mutable_fingerprints()->Add(b.fingerprints().begin(),
                                        b.fingerprints().end());
      // Its ranks' statistics-health scores go on up with it.
      block.mutable_health()->MergeFrom(b.health());
      const int offset = b.first_position() - first_position_;
      tree.AddBlock(offset, b.positions(), b.fingerprints_size(), c.rank(),
                    *std::move(payload));
      i = std::max<size_t>(i, offset + b.positions() - 1);
      continue;
    }
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
