#include "server/store/kv_state_store.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "server/domain/bounded_text.h"
#include "server/store/state_codec.h"

namespace syncnorm {
namespace {

// A step as keys spell it, zero-padded to 20 characters so that keys sort
// by step; formatted in place, for it is on every round's path.
class PaddedStep {
 public:
  explicit PaddedStep(int64_t step)
      : size_(absl::SNPrintF(text_, sizeof(text_), "%020d", step)) {}
  absl::string_view view() const { return absl::string_view(text_, size_); }

 private:
  char text_[24];  // 20 characters, a sign at most within them, and NUL
  size_t size_;
};

std::string JobKey(absl::string_view job) { return absl::StrCat("j/", job); }

std::string LayerKey(absl::string_view job, int group, int layer) {
  return absl::StrCat("l/", job, "/", group, "/", layer);
}

// A round of backward 0 (every FORWARD) has the key it had before there
// were several backwards per forward; a later backward's key adds its index.
std::string RoundKey(absl::string_view job, int group, int layer, Phase phase,
                     RoundId id) {
  std::string key =
      absl::StrCat("r/", job, "/", group, "/", layer, "/",
                   static_cast<int>(phase), "/", PaddedStep(id.step).view());
  if (id.backward != 0) absl::StrAppend(&key, "/", id.backward);
  return key;
}

std::string MembershipKey(absl::string_view job) {
  return absl::StrCat("e/", job);
}

std::string StaleAnswerKey(absl::string_view job, const StaleKey& k) {
  return absl::StrCat("s/", job, "/", k.group, "/", k.layer, "/",
                      static_cast<int>(k.phase), "/", PaddedStep(k.step).view(),
                      "/", k.rank);
}

std::string CheckpointKey(absl::string_view job, int64_t step) {
  return absl::StrCat("c/", job, "/", PaddedStep(step).view());
}

// Every key of `kind` ("l", "r", "c") of a job: [begin, end).
void DeleteAllOf(KvBatch& batch, absl::string_view kind,
                 absl::string_view job) {
  // '0' follows '/' in ASCII, so the range ends right after the prefix.
  batch.DeleteRange(absl::StrCat(kind, "/", job, "/"),
                    absl::StrCat(kind, "/", job, "0"));
}

// The numeric fields of a key after its kind and job: "l/job/1/2" -> {1, 2}.
bool ParseKey(absl::string_view key, size_t fields, std::string& job,
              std::vector<int64_t>& numbers) {
  std::vector<absl::string_view> parts = absl::StrSplit(key, '/');
  if (parts.size() != fields + 2) return false;
  job = std::string(parts[1]);
  numbers.clear();
  for (size_t i = 2; i < parts.size(); ++i) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(parts[i], &v) || v < 0) return false;
    numbers.push_back(v);
  }
  return true;
}

bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

bool SameBits(const RunningStats& a, const RunningStats& b) {
  return a.num_batches_tracked == b.num_batches_tracked &&
         SameBits(a.mean, b.mean) && SameBits(a.var, b.var);
}

}  // namespace

KvStateStore::KvStateStore(std::unique_ptr<KvEngine> engine)
    : engine_(std::move(engine)) {}

absl::Status KvStateStore::Corrupt(absl::string_view key,
                                   const absl::Status& cause) const {
  return absl::DataLossError(absl::StrCat(
      Describe(), ": record '", key, "' is corrupt: ", cause.message(),
      "; restore the folder from a backup, or move it away to start empty"));
}

absl::StatusOr<std::vector<StoredJob>> KvStateStore::LoadAll() {
  std::vector<StoredJob> jobs;
  std::vector<LayerId> stats_in_round;
  absl::Status s = LoadJobs(jobs);
  if (s.ok()) s = LoadLayers(jobs, stats_in_round);
  if (s.ok()) s = LoadRounds(jobs);
  if (s.ok()) s = TakeStatsFromRounds(jobs, stats_in_round);
  if (s.ok()) s = LoadCheckpoints(jobs);
  if (s.ok()) s = LoadMembership(jobs);
  if (s.ok()) s = LoadStaleAnswers(jobs);
  if (!s.ok()) return s;
  return jobs;
}

absl::Status KvStateStore::LoadJobs(std::vector<StoredJob>& jobs) {
  return engine_->Scan(
      "j/",
      [&](absl::string_view key, absl::string_view value) -> absl::Status {
        absl::StatusOr<JobSpec> spec = DecodeJob(value);
        if (!spec.ok()) return Corrupt(key, spec.status());
        if (JobKey(spec->job_id) != key) {
          return Corrupt(key, absl::DataLossError("it names another job"));
        }
        jobs.push_back(StoredJob{*std::move(spec), {}, {}, {}, {}});
        return absl::OkStatus();
      });
}

namespace {

StoredJob* FindJob(std::vector<StoredJob>& jobs, const std::string& id) {
  for (StoredJob& j : jobs) {
    if (j.spec.job_id == id) return &j;
  }
  return nullptr;
}

}  // namespace

absl::Status KvStateStore::LoadLayers(std::vector<StoredJob>& jobs,
                                      std::vector<LayerId>& stats_in_round) {
  return engine_->Scan(
      "l/",
      [&](absl::string_view key, absl::string_view value) -> absl::Status {
        std::string id;
        std::vector<int64_t> n;
        if (!ParseKey(key, 2, id, n)) {
          return Corrupt(key, absl::DataLossError("malformed key"));
        }
        StoredJob* job = FindJob(jobs, id);
        if (job == nullptr) return absl::OkStatus();  // unreachable leftovers
        if (n[0] >= job->spec.num_groups() ||
            n[1] >= static_cast<int64_t>(job->spec.layers.size())) {
          return Corrupt(key,
                         absl::DataLossError("group or layer out of range"));
        }
        bool in_round = false;
        absl::StatusOr<LayerState> state =
            DecodeLayer(value, job->spec.layers[n[1]], &in_round);
        if (!state.ok()) return Corrupt(key, state.status());
        if (in_round) {
          stats_in_round.emplace_back(id, static_cast<int>(n[0]),
                                      static_cast<int>(n[1]));
        }
        job->layers.push_back(
            StoredLayer{LayerSlot{static_cast<int>(n[0]),
                                  static_cast<int>(n[1]), *std::move(state)},
                        {}});
        return absl::OkStatus();
      });
}

absl::Status KvStateStore::LoadRounds(std::vector<StoredJob>& jobs) {
  return engine_->Scan(
      "r/",
      [&](absl::string_view key, absl::string_view value) -> absl::Status {
        std::string id;
        std::vector<int64_t> n;
        if (!ParseKey(key, 4, id, n) && !ParseKey(key, 5, id, n)) {
          return Corrupt(key, absl::DataLossError("malformed key"));
        }
        const int64_t backward = n.size() == 5 ? n[4] : 0;
        StoredJob* job = FindJob(jobs, id);
        if (job == nullptr) return absl::OkStatus();
        StoredLayer* layer = nullptr;
        for (StoredLayer& l : job->layers) {
          if (l.slot.group == n[0] && l.slot.layer == n[1]) layer = &l;
        }
        if (layer == nullptr) {
          return Corrupt(key, absl::DataLossError("a round without its layer"));
        }
        absl::StatusOr<StoredRound> round =
            DecodeRound(value, job->spec, layer->slot.group, layer->slot.layer);
        if (!round.ok()) return Corrupt(key, round.status());
        if (static_cast<int64_t>(round->phase) != n[2] || round->step != n[3] ||
            round->backward != backward || (n.size() == 5 && backward == 0)) {
          return Corrupt(key,
                         absl::DataLossError("the key and value disagree"));
        }
        layer->rounds.push_back(*std::move(round));
        return absl::OkStatus();
      });
}

absl::Status KvStateStore::TakeStatsFromRounds(
    std::vector<StoredJob>& jobs, const std::vector<LayerId>& layers) {
  for (const auto& [id, group, index] : layers) {
    StoredLayer* layer = nullptr;
    for (StoredLayer& l : FindJob(jobs, id)->layers) {
      if (l.slot.group == group && l.slot.layer == index) layer = &l;
    }
    LayerState& state = layer->slot.state;
    const StoredRound* source = nullptr;
    for (const StoredRound& r : layer->rounds) {
      if (r.phase == Phase::kForward && r.step == state.last_applied &&
          r.stats_after.has_value()) {
        source = &r;
      }
    }
    if (source == nullptr) {
      return Corrupt(LayerKey(id, group, index),
                     absl::DataLossError(absl::StrCat(
                         "its statistics are those after the forward round "
                         "of step ",
                         state.last_applied, ", whose record is missing")));
    }
    state.stats = *source->stats_after;
  }
  return absl::OkStatus();
}

absl::Status KvStateStore::LoadCheckpoints(std::vector<StoredJob>& jobs) {
  return engine_->Scan(
      "c/",
      [&](absl::string_view key, absl::string_view value) -> absl::Status {
        std::string id;
        std::vector<int64_t> n;
        if (!ParseKey(key, 1, id, n)) {
          return Corrupt(key, absl::DataLossError("malformed key"));
        }
        StoredJob* job = FindJob(jobs, id);
        if (job == nullptr) return absl::OkStatus();
        absl::StatusOr<CheckpointData> c = DecodeCheckpoint(value, job->spec);
        if (!c.ok()) return Corrupt(key, c.status());
        if (c->meta.step != n[0] || c->meta.job_id != id) {
          return Corrupt(key,
                         absl::DataLossError("the key and value disagree"));
        }
        job->checkpoints.push_back(std::move(c->meta));
        return absl::OkStatus();
      });
}

absl::Status KvStateStore::LoadMembership(std::vector<StoredJob>& jobs) {
  return engine_->Scan(
      "e/",
      [&](absl::string_view key, absl::string_view value) -> absl::Status {
        const std::string id(key.substr(2));
        StoredJob* job = FindJob(jobs, id);
        if (job == nullptr) return absl::OkStatus();  // as rounds are
        absl::StatusOr<std::vector<MembershipChange>> changes =
            DecodeMembership(value, job->spec);
        if (!changes.ok()) return Corrupt(key, changes.status());
        job->membership = *std::move(changes);
        return absl::OkStatus();
      });
}

absl::Status KvStateStore::LoadStaleAnswers(std::vector<StoredJob>& jobs) {
  return engine_->Scan(
      "s/",
      [&](absl::string_view key, absl::string_view value) -> absl::Status {
        std::string id;
        std::vector<int64_t> n;
        if (!ParseKey(key, 5, id, n)) {
          return Corrupt(key, absl::DataLossError("malformed key"));
        }
        StoredJob* job = FindJob(jobs, id);
        if (job == nullptr) return absl::OkStatus();  // as rounds are
        const JobSpec& spec = job->spec;
        if (n[0] >= spec.num_groups() ||
            n[1] >= static_cast<int64_t>(spec.layers.size()) ||
            (n[2] != static_cast<int>(Phase::kForward) &&
             n[2] != static_cast<int>(Phase::kBackward)) ||
            n[4] >= spec.world_size) {
          return Corrupt(key, absl::DataLossError(
                                  "group, layer, phase or rank out of range"));
        }
        const StaleKey k{static_cast<int>(n[0]), static_cast<int>(n[1]),
                         static_cast<Phase>(n[2]), n[3],
                         static_cast<int>(n[4])};
        absl::StatusOr<StoredStaleAnswer> a = DecodeStaleAnswer(value, spec, k);
        if (!a.ok()) return Corrupt(key, a.status());
        // The rank and every rank of its view are of the key's group.
        const std::vector<int> group = GroupRanks(spec, k.group);
        const auto in_group = [&](int rank) {
          return std::binary_search(group.begin(), group.end(), rank);
        };
        const bool fits =
            in_group(k.rank) &&
            std::all_of(a->outcome.view.begin(), a->outcome.view.end(),
                        [&](const ViewEntry& v) { return in_group(v.rank); });
        if (!fits) {
          return Corrupt(
              key, absl::DataLossError("its rank or view is not of its group"));
        }
        job->stale.push_back(*std::move(a));
        return absl::OkStatus();
      });
}

absl::Status KvStateStore::PutStaleAnswer(const std::string& job_id,
                                          const StoredStaleAnswer& answer,
                                          absl::Span<const StaleKey> evicted) {
  KvBatch batch;
  batch.Reserve(1 + evicted.size());
  batch.Put(StaleAnswerKey(job_id, answer.key), EncodeStaleAnswer(answer));
  for (const StaleKey& k : evicted) batch.Delete(StaleAnswerKey(job_id, k));
  return engine_->Write(batch);
}

absl::Status KvStateStore::PutMembership(
    const std::string& job_id,
    const std::vector<MembershipChange>& membership) {
  KvBatch batch;
  batch.Put(MembershipKey(job_id), EncodeMembership(membership));
  return engine_->Write(batch);
}

absl::Status KvStateStore::PutJob(const JobSpec& spec) {
  KvBatch batch;
  batch.Put(JobKey(spec.job_id), EncodeJob(spec));
  return engine_->Write(batch);
}

absl::Status KvStateStore::DeleteJob(const std::string& job_id) {
  KvBatch batch;
  batch.Delete(JobKey(job_id));
  batch.Delete(MembershipKey(job_id));
  for (const char* kind : {"l", "r", "c", "s"}) {
    DeleteAllOf(batch, kind, job_id);
  }
  return engine_->Write(batch);
}

absl::Status KvStateStore::PutJobImage(const JobImage& image) {
  const JobSpec& spec = image.job.spec;
  KvBatch batch;
  for (const char* kind : {"l", "r", "c", "s"}) {
    DeleteAllOf(batch, kind, spec.job_id);
  }
  batch.Put(JobKey(spec.job_id), EncodeJob(spec));
  if (image.job.membership.empty()) {
    batch.Delete(MembershipKey(spec.job_id));
  } else {
    batch.Put(MembershipKey(spec.job_id),
              EncodeMembership(image.job.membership));
  }
  for (const StoredLayer& layer : image.job.layers) {
    // With its statistics: the round that holds them may have been evicted
    // in the source store's retry window, never here.
    batch.Put(LayerKey(spec.job_id, layer.slot.group, layer.slot.layer),
              EncodeLayer(layer.slot.state));
    for (const StoredRound& round : layer.rounds) {
      batch.Put(RoundKey(spec.job_id, layer.slot.group, layer.slot.layer,
                         round.phase, RoundId{round.step, round.backward}),
                EncodeRound(round));
    }
  }
  for (const CheckpointData& c : image.checkpoints) {
    batch.Put(CheckpointKey(spec.job_id, c.meta.step), EncodeCheckpoint(c));
  }
  for (const StoredStaleAnswer& a : image.job.stale) {
    batch.Put(StaleAnswerKey(spec.job_id, a.key), EncodeStaleAnswer(a));
  }
  return engine_->Write(batch);
}

absl::StatusOr<std::vector<JobImage>> KvStateStore::LoadImages() {
  absl::StatusOr<std::vector<StoredJob>> jobs = LoadAll();
  if (!jobs.ok()) return jobs.status();
  std::vector<JobImage> images;
  for (StoredJob& job : *jobs) {
    JobImage image;
    for (const CheckpointMeta& meta : job.checkpoints) {
      absl::StatusOr<CheckpointData> c =
          GetCheckpoint(job.spec.job_id, meta.step);
      if (!c.ok()) return c.status();
      image.checkpoints.push_back(*std::move(c));
    }
    image.job = std::move(job);
    images.push_back(std::move(image));
  }
  return images;
}

absl::Status KvStateStore::CommitRound(const std::string& job_id,
                                       const LayerSlot& slot,
                                       const StoredRound& round,
                                       absl::Span<const RoundId> evicted) {
  KvBatch batch;
  batch.Reserve(2 + evicted.size());  // once per round: on the hot path
  // A forward round's stats_after are the layer's new statistics: stored
  // once, in the round record (a third of the bytes of every such commit).
  const bool stats_in_round = round.phase == Phase::kForward &&
                              round.step == slot.state.last_applied &&
                              round.stats_after.has_value() &&
                              SameBits(*round.stats_after, slot.state.stats);
  batch.Put(LayerKey(job_id, slot.group, slot.layer),
            EncodeLayer(slot.state, stats_in_round));
  // Deleted once it falls out of the retry window: the round log may keep
  // it from RocksDB until then, and then keep both from RocksDB. A round's
  // key is written once, as PutTransient asks: a step is not run again
  // unless a restore or a new job of the name deleted its rounds first.
  batch.PutTransient(RoundKey(job_id, slot.group, slot.layer, round.phase,
                              RoundId{round.step, round.backward}),
                     EncodeRound(round));
  for (const RoundId& id : evicted) {
    batch.Delete(RoundKey(job_id, slot.group, slot.layer, round.phase, id));
  }
  return engine_->Write(batch);
}

absl::Status KvStateStore::PutLayers(
    const std::string& job_id, absl::Span<const LayerSlot> layers,
    bool drop_rounds, const std::vector<MembershipChange>* membership) {
  KvBatch batch;
  if (drop_rounds) {
    DeleteAllOf(batch, "r", job_id);
    DeleteAllOf(batch, "s", job_id);
  }
  if (membership != nullptr) {
    batch.Put(MembershipKey(job_id), EncodeMembership(*membership));
  }
  for (const LayerSlot& slot : layers) {
    batch.Put(LayerKey(job_id, slot.group, slot.layer),
              EncodeLayer(slot.state));
  }
  return engine_->Write(batch);
}

absl::Status KvStateStore::PutCheckpoint(const CheckpointData& checkpoint,
                                         absl::Span<const int64_t> drop) {
  KvBatch batch;
  batch.Put(CheckpointKey(checkpoint.meta.job_id, checkpoint.meta.step),
            EncodeCheckpoint(checkpoint));
  for (int64_t step : drop) {
    batch.Delete(CheckpointKey(checkpoint.meta.job_id, step));
  }
  return engine_->Write(batch);
}

absl::StatusOr<CheckpointData> KvStateStore::GetCheckpoint(
    const std::string& job_id, int64_t step) {
  const std::string key = CheckpointKey(job_id, step);
  absl::StatusOr<std::optional<std::string>> value = engine_->Get(key);
  if (!value.ok()) return value.status();
  if (!value->has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "job '", BoundedText(job_id), "' has no checkpoint at step ", step,
        "; ListCheckpoints shows the steps it has"));
  }
  absl::StatusOr<std::optional<std::string>> job = engine_->Get(JobKey(job_id));
  if (!job.ok()) return job.status();
  if (!job->has_value()) {
    return Corrupt(key, absl::DataLossError("its job record is missing"));
  }
  absl::StatusOr<JobSpec> spec = DecodeJob(**job);
  if (!spec.ok()) return Corrupt(JobKey(job_id), spec.status());
  absl::StatusOr<CheckpointData> c = DecodeCheckpoint(**value, *spec);
  if (!c.ok()) return Corrupt(key, c.status());
  return c;
}

}  // namespace syncnorm
