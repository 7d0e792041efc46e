#include "server/store/state_codec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "server/store/state.pb.h"
#include "wire/rank_set.h"

namespace syncnorm {
namespace {

namespace pb = ::syncnorm::storage;

std::vector<double> ToVector(const google::protobuf::RepeatedField<double>& f) {
  return std::vector<double>(f.begin(), f.end());
}

void ToRepeated(const std::vector<double>& v,
                google::protobuf::RepeatedField<double>* f) {
  f->Assign(v.begin(), v.end());
}

absl::Status Bad(absl::string_view what) {
  return absl::DataLossError(std::string(what));
}

// DATA_LOSS unless `ranks` are ascending, distinct ranks of spec's world.
absl::Status CheckRanks(const std::vector<int>& ranks, const JobSpec& spec,
                        absl::string_view what) {
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= spec.world_size ||
        (i > 0 && ranks[i] <= ranks[i - 1])) {
      return Bad(absl::StrCat(what, " are not ascending ranks of 0..",
                              spec.world_size - 1));
    }
  }
  return absl::OkStatus();
}

// `ranks` from a rank list (format 2) or its runs (format 3), at most one
// of them set, checked; runs are never expanded, so that a damaged record
// cannot claim billions of ranks.
absl::Status RanksFromProto(
    const google::protobuf::RepeatedField<int32_t>& list,
    const google::protobuf::RepeatedField<int32_t>& runs, const JobSpec& spec,
    absl::string_view what, RankSet& ranks) {
  if (runs.empty()) {
    std::vector<int> listed(list.begin(), list.end());
    if (absl::Status s = CheckRanks(listed, spec, what); !s.ok()) return s;
    ranks = RankSet::Of(listed);
    return absl::OkStatus();
  }
  if (!list.empty()) {
    return Bad(absl::StrCat(what, " has both ranks and runs"));
  }
  absl::StatusOr<RankSet> set = RankSet::FromFlatRuns(
      absl::MakeConstSpan(runs.data(), runs.size()), spec.world_size);
  if (!set.ok())
    return Bad(absl::StrCat(what, " has ", set.status().message()));
  ranks = *std::move(set);
  return absl::OkStatus();
}

template <typename Message>
absl::Status Parse(absl::string_view value, Message& m, const char* kind) {
  if (!m.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
    return Bad(absl::StrCat("the ", kind, " record does not parse"));
  }
  if (m.format() == 0 || m.format() > kNewestStateFormat) {
    return Bad(absl::StrCat("the ", kind, " record has format ", m.format(),
                            "; this build reads formats 1..",
                            kNewestStateFormat,
                            " (was it written by a newer syncnorm?)"));
  }
  return absl::OkStatus();
}

void StatsToProto(const RunningStats& s, pb::Stats* out) {
  out->set_num_batches_tracked(s.num_batches_tracked);
  ToRepeated(s.mean, out->mutable_mean());
  ToRepeated(s.var, out->mutable_var());
}

absl::StatusOr<RunningStats> StatsFromProto(const pb::Stats& p, int channels) {
  if (p.mean_size() != channels || p.var_size() != channels) {
    return Bad(absl::StrCat("running statistics of ", p.mean_size(), "/",
                            p.var_size(), " channels for a layer of ",
                            channels));
  }
  if (p.num_batches_tracked() < 0) {
    return Bad("negative num_batches_tracked");
  }
  RunningStats s;
  s.num_batches_tracked = p.num_batches_tracked();
  s.mean = ToVector(p.mean());
  s.var = ToVector(p.var());
  return s;
}

void StateToProto(const LayerState& s, pb::LayerState* out) {
  StatsToProto(s.stats, out->mutable_stats());
  out->set_last_applied(s.last_applied);
  out->set_latest_forward(s.latest_completed[0]);
  out->set_latest_backward(s.latest_completed[1]);
  out->set_frozen(s.frozen);
}

// Without `with_stats` the statistics must be absent and stay empty.
absl::StatusOr<LayerState> StateFromProto(const pb::LayerState& p, int channels,
                                          bool with_stats = true) {
  RunningStats stats;
  if (with_stats) {
    absl::StatusOr<RunningStats> decoded = StatsFromProto(p.stats(), channels);
    if (!decoded.ok()) return decoded.status();
    stats = *std::move(decoded);
  } else if (p.has_stats()) {
    return Bad("statistics both in the layer and in a round record");
  }
  if (p.last_applied() < -1 || p.latest_forward() < -1 ||
      p.latest_backward() < -1) {
    return Bad("a step below -1");
  }
  LayerState s;
  s.stats = std::move(stats);
  s.last_applied = p.last_applied();
  s.latest_completed = {p.latest_forward(), p.latest_backward()};
  s.frozen = p.frozen();
  return s;
}

LayerConfig LayerFromProto(const pb::Layer& p) {
  LayerConfig l;
  l.name = p.name();
  l.channels = p.channels();
  l.rule.mode = static_cast<MomentumMode>(p.momentum_mode());
  l.rule.momentum = p.momentum();
  l.rule.biased_var = p.biased_var();
  l.rule.track = p.track();
  l.initial_running_mean = ToVector(p.initial_mean());
  l.initial_running_var = ToVector(p.initial_var());
  return l;
}

void LayerToProto(const LayerConfig& l, pb::Layer* p) {
  p->set_name(l.name);
  p->set_channels(l.channels);
  p->set_momentum_mode(static_cast<int>(l.rule.mode));
  p->set_momentum(l.rule.momentum);
  p->set_biased_var(l.rule.biased_var);
  p->set_track(l.rule.track);
  ToRepeated(l.initial_running_mean, p->mutable_initial_mean());
  ToRepeated(l.initial_running_var, p->mutable_initial_var());
}

absl::Status CheckRoundSizes(const pb::RoundRecord& p, int channels) {
  const bool forward = p.phase() == static_cast<int>(Phase::kForward);
  const int a = forward ? p.mean_size() : p.sum_dy_size();
  const int b = forward ? p.var_size() : p.sum_dy_xmu_size();
  if (a != channels || b != channels) {
    return Bad(absl::StrCat("a round result of ", a, "/", b,
                            " channels for a layer of ", channels));
  }
  return absl::OkStatus();
}

// A quorum round's missing ranks: ascending, of the round's group (`ranks`,
// ascending), and each one's fingerprint absent.
absl::Status CheckMissing(const pb::RoundRecord& p,
                          const std::vector<int>& ranks) {
  for (int i = 0; i < p.missing_ranks_size(); ++i) {
    const int rank = p.missing_ranks(i);
    const auto at = std::lower_bound(ranks.begin(), ranks.end(), rank);
    if (at == ranks.end() || *at != rank ||
        (i > 0 && rank <= p.missing_ranks(i - 1)) ||
        p.fingerprints(static_cast<int>(at - ranks.begin())).present()) {
      return Bad(absl::StrCat("a round whose missing rank ", rank,
                              " is out of range, out of order or present"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string EncodeJob(const JobSpec& spec) {
  pb::JobRecord p;
  p.set_format(kStateFormat);
  p.set_job_id(spec.job_id);
  p.set_world_size(spec.world_size);
  p.set_group_size(spec.group_size);
  p.set_round_timeout_ms(absl::ToInt64Milliseconds(spec.round_timeout));
  for (const LayerConfig& l : spec.layers) LayerToProto(l, p.add_layers());
  p.set_quorum_min_ranks(spec.quorum.min_ranks);
  p.set_quorum_grace_ms(absl::ToInt64Milliseconds(spec.quorum.grace));
  p.set_shard(spec.shard.shard);
  p.set_num_shards(spec.shard.num_shards);
  for (int layer : spec.shard.owned_layers) p.add_owned_layers(layer);
  for (const std::vector<int>& group : spec.groups) {
    p.add_groups()->mutable_ranks()->Assign(group.begin(), group.end());
  }
  if (!spec.members.empty()) {
    p.set_format(kMembershipFormat);
    p.mutable_members()->Assign(spec.members.begin(), spec.members.end());
  }
  if (spec.staleness > 0) {
    p.set_format(kMembershipFormat);
    p.set_staleness(spec.staleness);
  }
  p.set_stats_health_off(!spec.stats_health);
  return p.SerializeAsString();
}

absl::StatusOr<JobSpec> DecodeJob(absl::string_view value) {
  pb::JobRecord p;
  if (absl::Status s = Parse(value, p, "job"); !s.ok()) return s;
  JobSpec spec;
  spec.job_id = p.job_id();
  spec.world_size = p.world_size();
  spec.group_size = p.group_size();
  // Builds before the bounds took a round timeout above kMaxRoundTimeout
  // and a negative num_shards (meaning 0): such a job loads with the bound
  // as its timeout, unsharded, rather than stopping the start.
  spec.round_timeout =
      std::min(absl::Milliseconds(p.round_timeout_ms()), kMaxRoundTimeout);
  for (const pb::Layer& l : p.layers())
    spec.layers.push_back(LayerFromProto(l));
  spec.quorum.min_ranks = p.quorum_min_ranks();
  spec.quorum.grace = absl::Milliseconds(p.quorum_grace_ms());
  spec.shard.shard = p.shard();
  spec.shard.num_shards = std::max(0, p.num_shards());
  spec.shard.owned_layers.assign(p.owned_layers().begin(),
                                 p.owned_layers().end());
  for (const pb::RankGroup& group : p.groups()) {
    spec.groups.emplace_back(group.ranks().begin(), group.ranks().end());
  }
  spec.members.assign(p.members().begin(), p.members().end());
  spec.staleness = p.staleness();
  spec.stats_health = !p.stats_health_off();
  // A stored spec was resolved before it was written: resolving it again
  // must change nothing, which also validates it.
  absl::StatusOr<JobSpec> resolved = ResolveJobSpec(spec, absl::Seconds(1));
  if (!resolved.ok() || *resolved != spec) {
    return Bad(absl::StrCat("the job spec is not valid",
                            resolved.ok() ? "" : ": ",
                            resolved.ok() ? "" : resolved.status().message()));
  }
  return spec;
}

namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "WireWriter copies doubles as the wire's little-endian bytes");

// The records every completed round writes, on the answer path, are
// written straight from the domain's vectors: the bytes protobuf serializes
// the filled message to, without copying the per-channel vectors into a
// message first. Fields in number order, proto3 defaults left out, repeated
// scalars packed, as protobuf writes them; state_codec_test compares the
// two.
class WireWriter {
 public:
  using Out = google::protobuf::io::CodedOutputStream;
  static constexpr int kVarint = 0, kFixed64 = 1, kLength = 2;

  // Sizes (the first pass) and writes (the second) the same fields.
  explicit WireWriter(uint8_t* at) : at_(at) {}

  void Varint(int field, uint64_t v) {
    if (v == 0) return;
    Tag(field, kVarint);
    Put(Out::VarintSize64(v), [&] { at_ = Out::WriteVarint64ToArray(v, at_); });
  }
  void Fixed64(int field, uint64_t v) {
    if (v == 0) return;
    Tag(field, kFixed64);
    Put(8, [&] { at_ = Out::WriteLittleEndian64ToArray(v, at_); });
  }
  void Doubles(int field, const std::vector<double>& v) {
    if (v.empty()) return;
    const size_t bytes = v.size() * sizeof(double);
    Length(field, bytes);
    Put(bytes, [&] {
      std::memcpy(at_, v.data(), bytes);  // little-endian, as on the wire
      at_ += bytes;
    });
  }
  void Ints(int field, const std::vector<int>& v) {
    if (v.empty()) return;
    size_t bytes = 0;
    for (int x : v) bytes += Out::VarintSize64(SignExtended(x));
    Length(field, bytes);
    for (int x : v) {
      const uint64_t w = SignExtended(x);
      Put(Out::VarintSize64(w),
          [&] { at_ = Out::WriteVarint64ToArray(w, at_); });
    }
  }
  // A nested message: its fields are what `fill` writes to a writer.
  template <typename Fill>
  void Message(int field, Fill fill) {
    WireWriter inner(nullptr);
    fill(inner);
    Length(field, inner.size_);
    if (at_ != nullptr) {
      WireWriter body(at_);
      fill(body);
      at_ = body.at_;
    }
    size_ += inner.size_;
  }

  static uint64_t SignExtended(int64_t v) { return static_cast<uint64_t>(v); }
  size_t size() const { return size_; }

 private:
  void Tag(int field, int wire_type) {
    const uint32_t tag = static_cast<uint32_t>(field << 3 | wire_type);
    Put(Out::VarintSize32(tag),
        [&] { at_ = Out::WriteVarint32ToArray(tag, at_); });
  }
  void Length(int field, size_t bytes) {
    Tag(field, kLength);
    const auto n = static_cast<uint32_t>(bytes);
    Put(Out::VarintSize32(n), [&] { at_ = Out::WriteVarint32ToArray(n, at_); });
  }
  template <typename Write>
  void Put(size_t bytes, Write write) {
    size_ += bytes;
    if (at_ != nullptr) write();
  }

  uint8_t* at_;  // null: sizing only
  size_t size_ = 0;
};

void WriteStats(const RunningStats& s, WireWriter& m) {
  m.Varint(1, WireWriter::SignExtended(s.num_batches_tracked));
  m.Doubles(2, s.mean);
  m.Doubles(3, s.var);
}

// pb::LayerRecord; its state is always there, its statistics unless the
// round record holds them.
void WriteLayer(const LayerState& state, bool stats_in_round, WireWriter& w) {
  w.Varint(1, kStateFormat);
  w.Message(2, [&](WireWriter& m) {
    if (!stats_in_round) {
      m.Message(1, [&](WireWriter& st) { WriteStats(state.stats, st); });
    }
    m.Varint(2, WireWriter::SignExtended(state.last_applied));
    m.Varint(3, WireWriter::SignExtended(state.latest_completed[0]));
    m.Varint(4, WireWriter::SignExtended(state.latest_completed[1]));
    if (state.frozen) m.Varint(5, 1);
  });
  w.Varint(3, stats_in_round ? 1 : 0);
}

template <typename Write>
std::string WireBytes(Write write) {
  WireWriter sizing(nullptr);
  write(sizing);
  std::string out(sizing.size(), '\0');
  WireWriter writing(reinterpret_cast<uint8_t*>(out.data()));
  write(writing);
  return out;
}

void WriteRound(const StoredRound& round, WireWriter& w) {
  w.Varint(1, kStateFormat);
  w.Varint(2, WireWriter::SignExtended(static_cast<int>(round.phase)));
  w.Varint(3, WireWriter::SignExtended(round.step));
  w.Varint(4, WireWriter::SignExtended(round.outcome.version));
  w.Varint(5, WireWriter::SignExtended(round.outcome.moments.count));
  w.Doubles(6, round.outcome.moments.mean);
  w.Doubles(7, round.outcome.moments.var);
  w.Doubles(8, round.outcome.grad_sums.sum_dy);
  w.Doubles(9, round.outcome.grad_sums.sum_dy_xmu);
  for (const std::optional<uint64_t>& f : round.fingerprints) {
    w.Message(10, [&f](WireWriter& m) {
      m.Varint(1, f.has_value() ? 1 : 0);
      m.Fixed64(2, f.value_or(0));
    });
  }
  if (round.stats_after.has_value()) {
    const RunningStats& s = *round.stats_after;
    w.Message(11, [&s](WireWriter& m) { WriteStats(s, m); });
  }
  w.Ints(12, round.outcome.missing_ranks);
  w.Varint(13, WireWriter::SignExtended(round.backward));
  w.Varint(20, static_cast<uint32_t>(round.fingerprint_kind));
}

}  // namespace

std::string EncodeLayer(const LayerState& state, bool stats_in_round) {
  return WireBytes(
      [&](WireWriter& w) { WriteLayer(state, stats_in_round, w); });
}

absl::StatusOr<LayerState> DecodeLayer(absl::string_view value,
                                       const LayerConfig& layer,
                                       bool* stats_in_round) {
  pb::LayerRecord p;
  if (absl::Status s = Parse(value, p, "layer"); !s.ok()) return s;
  if (p.stats_in_round() && stats_in_round == nullptr) {
    return Bad("its statistics are kept in a round record");
  }
  if (stats_in_round != nullptr) *stats_in_round = p.stats_in_round();
  return StateFromProto(p.state(), layer.channels, !p.stats_in_round());
}

std::string EncodeRound(const StoredRound& round) {
  return WireBytes([&](WireWriter& w) { WriteRound(round, w); });
}

absl::StatusOr<StoredRound> DecodeRound(absl::string_view value,
                                        const JobSpec& spec, int group,
                                        int layer) {
  pb::RoundRecord p;
  if (absl::Status s = Parse(value, p, "round"); !s.ok()) return s;
  const int channels = spec.layers[layer].channels;
  const bool forward = p.phase() == static_cast<int>(Phase::kForward);
  if (!forward && p.phase() != static_cast<int>(Phase::kBackward)) {
    return Bad(absl::StrCat("a round of phase ", p.phase()));
  }
  if (absl::Status s = CheckRoundSizes(p, channels); !s.ok()) return s;
  const std::vector<int> ranks = GroupRanks(spec, group);
  if (p.fingerprints_size() != static_cast<int>(ranks.size())) {
    return Bad(absl::StrCat("a round of ", p.fingerprints_size(),
                            " ranks in a group of ", ranks.size()));
  }
  StoredRound r;
  r.phase = static_cast<Phase>(p.phase());
  r.step = p.step();
  r.backward = p.backward_index();
  if (r.backward < 0 || (forward && r.backward != 0)) {
    return Bad(absl::StrCat("a ", forward ? "FORWARD" : "BACKWARD",
                            " round of backward index ", r.backward));
  }
  r.outcome.version = p.version();
  if (forward) {
    r.outcome.moments.count = p.count();
    r.outcome.moments.mean = ToVector(p.mean());
    r.outcome.moments.var = ToVector(p.var());
    absl::StatusOr<RunningStats> after =
        StatsFromProto(p.stats_after(), channels);
    if (!after.ok()) return after.status();
    r.stats_after = *std::move(after);
  } else {
    r.outcome.grad_sums.sum_dy = ToVector(p.sum_dy());
    r.outcome.grad_sums.sum_dy_xmu = ToVector(p.sum_dy_xmu());
  }
  for (const pb::Fingerprint& f : p.fingerprints()) {
    r.fingerprints.push_back(f.present() ? std::optional<uint64_t>(f.value())
                                         : std::nullopt);
  }
  if (p.fingerprint_kind() > static_cast<uint32_t>(kFingerprintKind)) {
    return Bad(absl::StrCat("a round with fingerprint kind ",
                            p.fingerprint_kind(), " (this build knows 0..",
                            static_cast<int>(kFingerprintKind), ")"));
  }
  r.fingerprint_kind = static_cast<FingerprintKind>(p.fingerprint_kind());
  if (absl::Status s = CheckMissing(p, ranks); !s.ok()) return s;
  r.outcome.missing_ranks.assign(p.missing_ranks().begin(),
                                 p.missing_ranks().end());
  return r;
}

std::string EncodeCheckpoint(const CheckpointData& checkpoint) {
  pb::CheckpointRecord p;
  p.set_format(kStateFormat);
  p.set_job_id(checkpoint.meta.job_id);
  p.set_step(checkpoint.meta.step);
  p.set_tag(checkpoint.meta.tag);
  p.set_created_unix_ms(checkpoint.meta.created_unix_ms);
  for (const LayerSlot& slot : checkpoint.layers) {
    pb::CheckpointLayer* l = p.add_layers();
    l->set_group(slot.group);
    l->set_layer(slot.layer);
    StateToProto(slot.state, l->mutable_state());
  }
  if (checkpoint.meta.members.has_value()) {
    p.set_has_members(true);
    p.mutable_members()->Assign(checkpoint.meta.members->begin(),
                                checkpoint.meta.members->end());
    p.set_membership_version(checkpoint.meta.membership_version);
  }
  return p.SerializeAsString();
}

absl::StatusOr<CheckpointData> DecodeCheckpoint(absl::string_view value,
                                                const JobSpec& spec) {
  pb::CheckpointRecord p;
  if (absl::Status s = Parse(value, p, "checkpoint"); !s.ok()) return s;
  const int layers = static_cast<int>(spec.layers.size());
  CheckpointData c;
  c.meta.job_id = p.job_id();
  c.meta.step = p.step();
  c.meta.tag = p.tag();
  c.meta.created_unix_ms = p.created_unix_ms();
  if (p.has_members()) {
    std::vector<int> members(p.members().begin(), p.members().end());
    if (absl::Status s = CheckRanks(members, spec, "the checkpoint's members");
        !s.ok()) {
      return s;
    }
    c.meta.members = std::move(members);
    c.meta.membership_version = p.membership_version();
  }
  std::set<std::pair<int, int>> seen;
  for (const pb::CheckpointLayer& l : p.layers()) {
    if (l.group() < 0 || l.group() >= spec.num_groups() || l.layer() < 0 ||
        l.layer() >= layers || !spec.shard.owns(l.layer()) ||
        !seen.emplace(l.group(), l.layer()).second) {
      return Bad(absl::StrCat("the checkpoint has a bad or repeated (group ",
                              l.group(), ", layer ", l.layer(), ")"));
    }
    absl::StatusOr<LayerState> state =
        StateFromProto(l.state(), spec.layers[l.layer()].channels);
    if (!state.ok()) return state.status();
    c.layers.push_back(LayerSlot{l.group(), l.layer(), *std::move(state)});
  }
  // A shard's checkpoint holds exactly the layers it owns.
  const int owned = spec.shard.sharded()
                        ? static_cast<int>(spec.shard.owned_layers.size())
                        : layers;
  if (static_cast<int>(seen.size()) != owned * spec.num_groups()) {
    return Bad(absl::StrCat("the checkpoint holds ", seen.size(), " of ",
                            owned * spec.num_groups(), " (group, layer)s"));
  }
  return c;
}

std::string EncodeMembership(const std::vector<MembershipChange>& changes) {
  pb::MembershipRecord p;
  p.set_format(kMembershipRunsFormat);
  for (const MembershipChange& c : changes) {
    pb::MembershipChange* out = p.add_changes();
    out->set_version(c.version);
    out->set_step(c.step);
    AddFlatRuns(c.members, out->mutable_member_runs());
    AddFlatRuns(c.joined, out->mutable_joined_runs());
    AddFlatRuns(c.left, out->mutable_left_runs());
    AddFlatRuns(c.removed, out->mutable_removed_runs());
    out->set_restored(c.restored);
  }
  return p.SerializeAsString();
}

std::string EncodeStaleAnswer(const StoredStaleAnswer& a) {
  pb::StaleAnswerRecord p;
  p.set_format(kMembershipFormat);
  if (const auto* m = std::get_if<Moments>(&a.payload)) {
    p.set_count(m->count);
    ToRepeated(m->mean, p.mutable_mean());
    ToRepeated(m->m2, p.mutable_m2());
  } else if (const auto* g = std::get_if<GradSums>(&a.payload)) {
    ToRepeated(g->sum_dy, p.mutable_sum_dy());
    ToRepeated(g->sum_dy_xmu, p.mutable_sum_dy_xmu());
  }
  p.set_fingerprint(a.fingerprint);
  p.set_fingerprint_kind(static_cast<uint32_t>(a.fingerprint_kind));
  const RoundOutcome& o = a.outcome;
  p.set_result_count(o.moments.count);
  ToRepeated(o.moments.mean, p.mutable_result_mean());
  ToRepeated(o.moments.var, p.mutable_result_var());
  ToRepeated(o.grad_sums.sum_dy, p.mutable_result_sum_dy());
  ToRepeated(o.grad_sums.sum_dy_xmu, p.mutable_result_sum_dy_xmu());
  p.set_version(o.version);
  for (const ViewEntry& v : o.view) {
    p.add_view_ranks(v.rank);
    p.add_view_steps(v.step);
  }
  return p.SerializeAsString();
}

absl::StatusOr<StoredStaleAnswer> DecodeStaleAnswer(absl::string_view value,
                                                    const JobSpec& spec,
                                                    const StaleKey& key) {
  pb::StaleAnswerRecord p;
  if (absl::Status s = Parse(value, p, "stale answer"); !s.ok()) return s;
  const int channels = spec.layers[key.layer].channels;
  const auto sized = [&](const google::protobuf::RepeatedField<double>& f) {
    return f.size() == channels;
  };
  StoredStaleAnswer a;
  a.key = key;
  a.fingerprint = p.fingerprint();
  if (p.fingerprint_kind() > static_cast<uint32_t>(kFingerprintKind)) {
    return Bad("a stale answer with an unknown fingerprint kind");
  }
  a.fingerprint_kind = static_cast<FingerprintKind>(p.fingerprint_kind());
  RoundOutcome& o = a.outcome;
  o.version = p.version();
  if (key.phase == Phase::kForward) {
    if (!sized(p.mean()) || !sized(p.m2()) || !sized(p.result_mean()) ||
        !sized(p.result_var()) || p.count() < 0 || p.result_count() < 0) {
      return Bad(
          absl::StrCat("a stale forward answer that does not fit a "
                       "layer of ",
                       channels, " channels"));
    }
    Moments m;
    m.count = p.count();
    m.mean = ToVector(p.mean());
    m.m2 = ToVector(p.m2());
    a.payload = std::move(m);
    o.moments.count = p.result_count();
    o.moments.mean = ToVector(p.result_mean());
    o.moments.var = ToVector(p.result_var());
  } else {
    if (!sized(p.sum_dy()) || !sized(p.sum_dy_xmu()) ||
        !sized(p.result_sum_dy()) || !sized(p.result_sum_dy_xmu())) {
      return Bad(
          absl::StrCat("a stale backward answer that does not fit a "
                       "layer of ",
                       channels, " channels"));
    }
    GradSums g;
    g.sum_dy = ToVector(p.sum_dy());
    g.sum_dy_xmu = ToVector(p.sum_dy_xmu());
    a.payload = std::move(g);
    o.grad_sums.sum_dy = ToVector(p.result_sum_dy());
    o.grad_sums.sum_dy_xmu = ToVector(p.result_sum_dy_xmu());
  }
  if (p.view_ranks_size() != p.view_steps_size()) {
    return Bad("a stale answer whose view has ranks and steps apart");
  }
  for (int i = 0; i < p.view_ranks_size(); ++i) {
    const int rank = p.view_ranks(i);
    if (rank < 0 || rank >= spec.world_size || p.view_steps(i) < 0 ||
        (i > 0 && rank <= p.view_ranks(i - 1))) {
      return Bad("a stale answer whose view is not ascending ranks");
    }
    o.view.push_back(ViewEntry{rank, p.view_steps(i)});
  }
  return a;
}

absl::StatusOr<std::vector<MembershipChange>> DecodeMembership(
    absl::string_view value, const JobSpec& spec) {
  pb::MembershipRecord p;
  if (absl::Status s = Parse(value, p, "membership"); !s.ok()) return s;
  if (p.changes().empty()) return Bad("the membership record has no change");
  std::vector<MembershipChange> out;
  for (const pb::MembershipChange& m : p.changes()) {
    MembershipChange c;
    c.version = m.version();
    c.step = m.step();
    c.restored = m.restored();
    const std::string what = absl::StrCat("membership version ", c.version);
    for (auto [list, runs, ranks] :
         {std::make_tuple(&m.members(), &m.member_runs(), &c.members),
          std::make_tuple(&m.joined(), &m.joined_runs(), &c.joined),
          std::make_tuple(&m.left(), &m.left_runs(), &c.left),
          std::make_tuple(&m.removed(), &m.removed_runs(), &c.removed)}) {
      if (absl::Status s = RanksFromProto(*list, *runs, spec, what, *ranks);
          !s.ok()) {
        return s;
      }
    }
    if (c.members.empty() || c.step < 0 || c.version < 0 ||
        (!out.empty() &&
         (c.version <= out.back().version || c.step < out.back().step))) {
      return Bad(absl::StrCat(what, " (step ", c.step,
                              ") has no members or is out of order"));
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace syncnorm
