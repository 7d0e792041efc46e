#include "server/domain/job_spec.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/domain/bounded_text.h"

namespace syncnorm {
namespace {

constexpr size_t kMaxJobIdLength = 128;
// Every valid job_id shows whole in messages.
static_assert(kMaxJobIdLength <= kBoundedTextBytes);
// Absolute bounds, whatever the server's (tighter, configurable) limits:
// a spec beyond them would make resolution or the first round allocate
// gigabytes (found by server/rpc/request_fuzz.cc).
constexpr int kMaxWorldSize = 1 << 20;
constexpr int kMaxChannels = 1 << 24;
constexpr size_t kMaxLayers = 1 << 16;

bool IsJobIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

absl::Status CheckJobId(absl::string_view id) {
  if (id.empty() || id.size() > kMaxJobIdLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job_id has ", id.size(), " characters; it must have 1 to ",
        kMaxJobIdLength, " characters of [A-Za-z0-9._-]"));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    if (!IsJobIdChar(id[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("job_id '", BoundedText(id),
                       "' has a forbidden character at position ", i,
                       "; use only [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckShape(const JobSpec& spec) {
  if (spec.world_size <= 0 || spec.world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size is ", spec.world_size,
        "; it must be the (positive) number of contributing ranks, at most ",
        kMaxWorldSize));
  }
  if (!spec.groups.empty() && spec.group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group_size is ", spec.group_size, " and ", spec.groups.size(),
        " groups are given; give group_size (consecutive blocks) or groups "
        "(rank lists), not both"));
  }
  if (spec.group_size < 0 ||
      (spec.group_size > 0 && spec.world_size % spec.group_size != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("group_size is ", spec.group_size,
                     "; it must be 0 (one group) or a "
                     "positive divisor of world_size ",
                     spec.world_size));
  }
  if (spec.round_timeout < absl::ZeroDuration() ||
      spec.round_timeout > kMaxRoundTimeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round_timeout_ms is ", absl::ToInt64Milliseconds(spec.round_timeout),
        "; it must be within [0, ", absl::ToInt64Milliseconds(kMaxRoundTimeout),
        "] (24 hours; 0: the server default)"));
  }
  if (spec.layers.empty()) {
    return absl::InvalidArgumentError(
        "the job has no layers; give at least one LayerSpec");
  }
  if (spec.layers.size() > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job has ", spec.layers.size(), " layers; at most ", kMaxLayers));
  }
  return absl::OkStatus();
}

// Checks the initial members of an elastic job and sorts them; a list of
// every rank is no list. REQUIRES: CheckShape(spec).ok().
absl::Status ResolveMembers(JobSpec& spec) {
  std::vector<bool> seen(spec.world_size, false);
  for (int rank : spec.members) {
    if (rank < 0 || rank >= spec.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("members has rank ", rank, ", outside the ranks 0..",
                       spec.world_size - 1,
                       " (world_size is the rank space of an elastic job)"));
    }
    if (seen[rank]) {
      return absl::InvalidArgumentError(
          absl::StrCat("members has rank ", rank, " twice"));
    }
    seen[rank] = true;
  }
  std::sort(spec.members.begin(), spec.members.end());
  if (spec.members.size() == static_cast<size_t>(spec.world_size)) {
    spec.members.clear();
  }
  return absl::OkStatus();
}

// Checks that `groups` partition the ranks of the world, then sorts them
// and, when they are consecutive blocks of one size, makes them group_size.
// REQUIRES: CheckShape(spec).ok().
absl::Status ResolveGroups(JobSpec& spec) {
  if (spec.groups.empty()) return absl::OkStatus();
  std::vector<int> group_of(spec.world_size, -1);
  for (size_t g = 0; g < spec.groups.size(); ++g) {
    if (spec.groups[g].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "groups[", g, "] has no ranks; every group needs at least one"));
    }
    for (int rank : spec.groups[g]) {
      if (rank < 0 || rank >= spec.world_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "groups[", g, "] has rank ", rank,
            ", outside the world's ranks 0..", spec.world_size - 1));
      }
      if (group_of[rank] >= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", rank, " is in groups[", group_of[rank], "] and groups[", g,
            "]; every rank must be in exactly one group"));
      }
      group_of[rank] = static_cast<int>(g);
    }
  }
  for (int rank = 0; rank < spec.world_size; ++rank) {
    if (group_of[rank] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, " is in no group; every rank 0..", spec.world_size - 1,
          " must be in exactly one (a rank alone is a group of one)"));
    }
  }
  for (std::vector<int>& g : spec.groups) std::sort(g.begin(), g.end());
  std::sort(spec.groups.begin(), spec.groups.end());
  const size_t k = spec.groups[0].size();
  bool blocks = true;
  for (size_t g = 0; blocks && g < spec.groups.size(); ++g) {
    blocks = spec.groups[g].size() == k &&
             spec.groups[g].front() == static_cast<int>(g * k);
  }
  if (blocks) {
    spec.group_size = static_cast<int>(k);
    spec.groups.clear();
  }
  return absl::OkStatus();
}

// REQUIRES: spec's groups and round_timeout resolved.
absl::Status CheckQuorum(const JobSpec& spec) {
  const QuorumPolicy& q = spec.quorum;
  const int smallest = SmallestGroupSize(spec);
  if (q.min_ranks < 0 || q.min_ranks > smallest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quorum.min_ranks is ", q.min_ranks, "; it must be within [0, ",
        smallest, "] (0: off; counted per group of ",
        spec.groups.empty() ? "" : "at least ", smallest, " ranks)"));
  }
  const int64_t grace_ms = absl::ToInt64Milliseconds(q.grace);
  if (q.grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("quorum.grace_ms is ", grace_ms, "; it must be >= 0"));
  }
  if (q.min_ranks == 0 && q.grace != absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("quorum.grace_ms is ", grace_ms,
                     " but quorum.min_ranks is 0 (off); "
                     "set min_ranks to use a quorum, or grace_ms to 0"));
  }
  if (q.min_ranks > 0 && q.grace >= spec.round_timeout) {
    return absl::InvalidArgumentError(
        absl::StrCat("quorum.grace_ms is ", grace_ms,
                     "; it must be below the round "
                     "timeout (",
                     absl::ToInt64Milliseconds(spec.round_timeout), " ms)"));
  }
  return absl::OkStatus();
}

std::string LayerLabel(size_t index, const LayerConfig& layer) {
  return absl::StrCat("layers[", index, "] ('", BoundedText(layer.name), "')");
}

absl::Status CheckInitial(const std::string& label, const char* field,
                          const std::vector<double>& values, int channels,
                          bool non_negative) {
  if (!values.empty() && values.size() != static_cast<size_t>(channels)) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": ", field, " has ", values.size(),
        " values; give none (default) or exactly num_features = ", channels));
  }
  for (size_t c = 0; c < values.size(); ++c) {
    if (!std::isfinite(values[c]) || (non_negative && values[c] < 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": ", field, "[", c, "] is ", values[c], "; it must be ",
          non_negative ? "finite and >= 0" : "finite"));
    }
  }
  return absl::OkStatus();
}

// Validates one layer and fills in its defaults.
absl::Status ResolveLayer(size_t index, LayerConfig& layer) {
  const std::string label = LayerLabel(index, layer);
  if (layer.channels <= 0 || layer.channels > kMaxChannels) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": num_features is ", layer.channels,
                     "; it must be positive, at most ", kMaxChannels));
  }
  RunningRule& rule = layer.rule;
  if (rule.mode == kMomentumModeUnspecified) rule.mode = MomentumMode::kTorch;
  if (rule.mode != MomentumMode::kTorch && rule.mode != MomentumMode::kDecay &&
      rule.mode != MomentumMode::kCumulative) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": momentum_mode ", static_cast<int>(rule.mode),
                     " is unknown; use MOMENTUM_TORCH, MOMENTUM_DECAY or "
                     "MOMENTUM_CUMULATIVE"));
  }
  if (!std::isfinite(rule.momentum) || rule.momentum < 0 || rule.momentum > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": momentum is ", rule.momentum,
                     "; it must be within [0, 1] (0: the mode's default)"));
  }
  if (rule.momentum == 0) rule.momentum = DefaultMomentum(rule.mode);
  absl::Status s = CheckInitial(label, "initial_running_mean",
                                layer.initial_running_mean, layer.channels,
                                /*non_negative=*/false);
  if (s.ok()) {
    s = CheckInitial(label, "initial_running_var", layer.initial_running_var,
                     layer.channels, /*non_negative=*/true);
  }
  if (!s.ok()) return s;
  if (layer.initial_running_mean.empty()) {
    layer.initial_running_mean.assign(layer.channels, 0.0);
  }
  if (layer.initial_running_var.empty()) {
    layer.initial_running_var.assign(layer.channels, 1.0);
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int> GroupRanks(const JobSpec& spec, int g) {
  if (!spec.groups.empty()) return spec.groups[g];
  const int k = spec.group_size > 0 ? spec.group_size : spec.world_size;
  std::vector<int> ranks(k);
  for (int i = 0; i < k; ++i) ranks[i] = g * k + i;
  return ranks;
}

int SmallestGroupSize(const JobSpec& spec) {
  if (spec.groups.empty()) {
    return spec.group_size > 0 ? spec.group_size : spec.world_size;
  }
  size_t smallest = spec.groups[0].size();
  for (const std::vector<int>& g : spec.groups) {
    smallest = std::min(smallest, g.size());
  }
  return static_cast<int>(smallest);
}

absl::Status CheckStep(int64_t step, absl::string_view field) {
  if (step >= 0 && step <= kMaxStep) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, " is ", step, "; steps are within [0, ", kMaxStep, "] (2^53-1)"));
}

absl::Status CheckNewNames(const JobSpec& spec) {
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const std::string& name = spec.layers[i].name;
    if (name.size() > kMaxNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layers[", i, "] has a name of ", name.size(), " bytes ('",
          BoundedText(name), "'); a layer name has at most ", kMaxNameBytes,
          " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTag(absl::string_view tag) {
  if (tag.size() <= kMaxNameBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the checkpoint tag has ", tag.size(), " bytes ('", BoundedText(tag),
      "'); a tag has at most ", kMaxNameBytes, " bytes"));
}

absl::StatusOr<JobSpec> ResolveJobSpec(JobSpec spec,
                                       absl::Duration default_round_timeout) {
  absl::Status s = CheckJobId(spec.job_id);
  if (s.ok()) s = CheckShape(spec);
  for (size_t i = 0; s.ok() && i < spec.layers.size(); ++i) {
    s = ResolveLayer(i, spec.layers[i]);
  }
  if (s.ok()) s = ResolveGroups(spec);
  if (s.ok()) s = ResolveMembers(spec);
  if (!s.ok()) return s;
  if (spec.group_size == 0 && spec.groups.empty()) {
    spec.group_size = spec.world_size;
  }
  if (spec.round_timeout == absl::ZeroDuration()) {
    spec.round_timeout = default_round_timeout;
  }
  if (absl::Status q = CheckQuorum(spec); !q.ok()) return q;
  if (spec.staleness < 0 || spec.staleness > kMaxStaleness) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staleness is ", spec.staleness, "; it must be within [0, ",
        kMaxStaleness, "] (0: synchronous rounds)"));
  }
  if (spec.staleness > 0 && spec.quorum.enabled()) {
    return absl::InvalidArgumentError(
        "staleness and quorum are both set; a stale-synchronous job does not "
        "wait for a straggler within its bound already: drop the quorum");
  }
  if (absl::Status a = CheckShardAssignment(
          spec.shard, static_cast<int>(spec.layers.size()));
      !a.ok()) {
    return a;
  }
  return spec;
}

bool operator==(const LayerConfig& a, const LayerConfig& b) {
  return a.name == b.name && a.channels == b.channels &&
         a.rule.mode == b.rule.mode && a.rule.momentum == b.rule.momentum &&
         a.rule.biased_var == b.rule.biased_var &&
         a.rule.track == b.rule.track &&
         a.initial_running_mean == b.initial_running_mean &&
         a.initial_running_var == b.initial_running_var;
}

bool operator!=(const LayerConfig& a, const LayerConfig& b) {
  return !(a == b);
}

bool operator==(const QuorumPolicy& a, const QuorumPolicy& b) {
  return a.min_ranks == b.min_ranks && a.grace == b.grace;
}

bool operator==(const JobSpec& a, const JobSpec& b) {
  return a.job_id == b.job_id && a.world_size == b.world_size &&
         a.group_size == b.group_size && a.groups == b.groups &&
         a.round_timeout == b.round_timeout && a.layers == b.layers &&
         a.quorum == b.quorum && a.shard == b.shard && a.members == b.members &&
         a.staleness == b.staleness && a.stats_health == b.stats_health;
}

bool operator!=(const JobSpec& a, const JobSpec& b) { return !(a == b); }

}  // namespace syncnorm
