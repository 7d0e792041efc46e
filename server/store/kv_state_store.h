// The StateStore over an ordered key-value engine (RocksDB in production).
#ifndef SYNCNORM_SERVER_STORE_KV_STATE_STORE_H_
#define SYNCNORM_SERVER_STORE_KV_STATE_STORE_H_

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "server/store/kv_engine.h"
#include "server/store/state_store.h"

namespace syncnorm {

// Keys (job ids never contain '/'; steps are zero-padded so that key order
// is step order):
//   j/<job>                                   JobRecord
//   l/<job>/<group>/<layer>                   LayerRecord
//   r/<job>/<group>/<layer>/<phase>/<step>    RoundRecord
//   c/<job>/<step>                            CheckpointRecord
//   e/<job>                                   MembershipRecord
//   s/<job>/<group>/<layer>/<phase>/<step>/<rank>  StaleAnswerRecord
// Values are server/store/state.proto messages. Thread-safe.
class KvStateStore final : public StateStore {
 public:
  explicit KvStateStore(std::unique_ptr<KvEngine> engine);

  std::string Describe() const override { return engine_->Describe(); }
  absl::StatusOr<std::vector<StoredJob>> LoadAll() override;
  absl::Status PutJob(const JobSpec& spec) override;
  absl::Status DeleteJob(const std::string& job_id) override;
  absl::Status CommitRound(const std::string& job_id, const LayerSlot& slot,
                           const StoredRound& round,
                           absl::Span<const RoundId> evicted) override;
  absl::Status PutLayers(
      const std::string& job_id, absl::Span<const LayerSlot> layers,
      bool drop_rounds,
      const std::vector<MembershipChange>* membership = nullptr) override;
  absl::Status PutStaleAnswer(const std::string& job_id,
                              const StoredStaleAnswer& answer,
                              absl::Span<const StaleKey> evicted) override;
  absl::Status PutMembership(
      const std::string& job_id,
      const std::vector<MembershipChange>& membership) override;
  absl::Status PutCheckpoint(const CheckpointData& checkpoint,
                             absl::Span<const int64_t> drop_steps) override;
  absl::StatusOr<CheckpointData> GetCheckpoint(const std::string& job_id,
                                               int64_t step) override;
  absl::Status PutJobImage(const JobImage& image) override;
  absl::Status CopyTo(const std::string& dir) override {
    return engine_->CopyTo(dir);
  }

  // LoadAll() with each job's checkpoints read in full (a backup's jobs).
  absl::StatusOr<std::vector<JobImage>> LoadImages();

  KvEngine& engine() { return *engine_; }

 private:
  absl::Status LoadJobs(std::vector<StoredJob>& jobs);
  // Layer records whose statistics are in a round record: (job, group,
  // layer), filled in by TakeStatsFromRounds once the rounds are loaded.
  using LayerId = std::tuple<std::string, int, int>;
  absl::Status LoadLayers(std::vector<StoredJob>& jobs,
                          std::vector<LayerId>& stats_in_round);
  absl::Status LoadRounds(std::vector<StoredJob>& jobs);
  absl::Status TakeStatsFromRounds(std::vector<StoredJob>& jobs,
                                   const std::vector<LayerId>& layers);
  absl::Status LoadCheckpoints(std::vector<StoredJob>& jobs);
  absl::Status LoadMembership(std::vector<StoredJob>& jobs);
  absl::Status LoadStaleAnswers(std::vector<StoredJob>& jobs);
  // DATA_LOSS naming the store and the key, with `cause`'s message.
  absl::Status Corrupt(absl::string_view key, const absl::Status& cause) const;

  const std::unique_ptr<KvEngine> engine_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_STORE_KV_STATE_STORE_H_
