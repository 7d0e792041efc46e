// KvStateStore over RocksDB and over memory: records round-trip through a
// reopen, deletes remove everything of a job, and a record that does not
// decode or fit its job stops LoadAll with DATA_LOSS naming the folder and
// the key.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "server/store/kv_state_store.h"
#include "server/store/memory_engine.h"
#include "server/store/rocksdb_engine.h"
#include "server/store/state_codec.h"

namespace syncnorm {
namespace {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return absl::StrCat(base != nullptr ? base : "/tmp", "/", name);
}

JobSpec Spec(const std::string& id) {
  JobSpec s;
  s.job_id = id;
  s.world_size = 2;
  s.group_size = 2;
  s.round_timeout = absl::Seconds(3);
  LayerConfig l;
  l.name = "bn";
  l.channels = 2;
  l.rule.mode = MomentumMode::kTorch;
  l.rule.momentum = 0.1;
  l.initial_running_mean = {0, 0};
  l.initial_running_var = {1, 1};
  s.layers.push_back(l);
  return s;
}

LayerSlot Slot(double x) {
  LayerSlot slot;
  slot.state.stats = RunningStats{3, {x, -x}, {1.5, 2.5}};
  slot.state.last_applied = 4;
  slot.state.latest_completed = {4, 3};
  return slot;
}

StoredRound Round(int64_t step) {
  StoredRound r;
  r.phase = Phase::kForward;
  r.step = step;
  r.outcome.version = step + 1;
  r.outcome.moments = GlobalMoments{6, {0.5, 1.5}, {2, 3}};
  r.fingerprints = {123u, std::nullopt};
  r.stats_after = RunningStats{step + 1, {1, 2}, {3, 4}};
  return r;
}

void Fill(StateStore& store) {
  ASSERT_TRUE(store.PutJob(Spec("a")).ok());
  ASSERT_TRUE(store.PutJob(Spec("b")).ok());
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<RoundId> evicted;
    if (step == 2) evicted.push_back(RoundId{0, 0});
    ASSERT_TRUE(store.CommitRound("a", Slot(step), Round(step), evicted).ok());
  }
  CheckpointData c;
  c.meta.job_id = "a";
  c.meta.step = 2;
  c.meta.tag = "t";
  c.meta.created_unix_ms = 99;
  c.layers.push_back(Slot(7));
  ASSERT_TRUE(store.PutCheckpoint(c, {}).ok());
}

void CheckFilled(StateStore& store) {
  auto jobs = store.LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  const StoredJob& a = (*jobs)[0];
  EXPECT_TRUE(a.spec == Spec("a"));
  ASSERT_EQ(a.layers.size(), 1u);
  EXPECT_EQ(a.layers[0].slot.state.stats.mean, Slot(2).state.stats.mean);
  EXPECT_EQ(a.layers[0].slot.state.latest_completed[1], 3);
  ASSERT_EQ(a.layers[0].rounds.size(), 2u);  // step 0 was evicted
  EXPECT_EQ(a.layers[0].rounds[0].step, 1);
  EXPECT_EQ(a.layers[0].rounds[1].fingerprints,
            (std::vector<std::optional<uint64_t>>{123u, std::nullopt}));
  EXPECT_EQ(a.layers[0].rounds[1].stats_after->num_batches_tracked, 3);
  ASSERT_EQ(a.checkpoints.size(), 1u);
  EXPECT_EQ(a.checkpoints[0].tag, "t");
  auto c = store.GetCheckpoint("a", 2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->layers[0].state.stats.mean, Slot(7).state.stats.mean);
  EXPECT_EQ(store.GetCheckpoint("a", 3).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(StateStoreTest, RoundTripInMemory) {
  KvStateStore store(std::make_unique<MemoryEngine>());
  Fill(store);
  CheckFilled(store);
  ASSERT_TRUE(store.DeleteJob("a").ok());
  auto jobs = store.LoadAll();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].spec.job_id, "b");
}

TEST(StateStoreTest, RoundTripThroughRocksDbAndAReopen) {
  const std::string dir = TempDir("roundtrip/nested/data");
  {
    auto engine = RocksDbEngine::Open(dir, /*sync_writes=*/true);
    ASSERT_TRUE(engine.ok()) << engine.status();
    KvStateStore store(*std::move(engine));
    Fill(store);
    // A second store on the same folder is refused while this one is open.
    auto second = RocksDbEngine::Open(dir, false);
    EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(absl::StrContains(second.status().message(), "another"))
        << second.status();
  }
  auto engine = RocksDbEngine::Open(dir, false);
  ASSERT_TRUE(engine.ok()) << engine.status();
  KvStateStore store(*std::move(engine));
  CheckFilled(store);
  // A restore drops every stored round of the job.
  ASSERT_TRUE(store.PutLayers("a", {Slot(9)}, /*drop_rounds=*/true).ok());
  auto jobs = store.LoadAll();
  ASSERT_TRUE(jobs.ok());
  EXPECT_TRUE((*jobs)[0].layers[0].rounds.empty());
  EXPECT_EQ((*jobs)[0].layers[0].slot.state.stats.mean[0], 9);
}

TEST(StateStoreTest, MembershipRoundTripsAndGoesWithItsJob) {
  const std::string dir = TempDir("membership");
  const std::vector<MembershipChange> history = {
      MembershipChange{0, 0, {0, 1}, {}, {}, {}, false},
      MembershipChange{1, 5, {0}, {}, {}, {1}, false},
      MembershipChange{2, 9, {0, 1}, {1}, {}, {}, true},
  };
  JobSpec elastic = Spec("a");
  elastic.world_size = 4;
  elastic.group_size = 4;
  elastic.members = {0, 1};
  {
    auto engine = RocksDbEngine::Open(dir, false);
    ASSERT_TRUE(engine.ok()) << engine.status();
    KvStateStore store(*std::move(engine));
    ASSERT_TRUE(store.PutJob(elastic).ok());
    ASSERT_TRUE(store.PutJob(Spec("b")).ok());
    ASSERT_TRUE(store.PutMembership("a", {history[0], history[1]}).ok());
    // A restore writes the layers and the membership at once.
    ASSERT_TRUE(store.PutLayers("a", {Slot(1)}, true, &history).ok());
    CheckpointData c;
    c.meta.job_id = "a";
    c.meta.step = 8;
    c.meta.members = std::vector<int>{0, 3};
    c.meta.membership_version = 1;
    c.layers.push_back(Slot(7));
    ASSERT_TRUE(store.PutCheckpoint(c, {}).ok());
  }
  auto engine = RocksDbEngine::Open(dir, false);
  ASSERT_TRUE(engine.ok());
  KvStateStore store(*std::move(engine));
  auto jobs = store.LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_TRUE((*jobs)[0].spec == elastic);
  EXPECT_EQ((*jobs)[0].membership, history);
  EXPECT_TRUE((*jobs)[1].membership.empty());
  auto c = store.GetCheckpoint("a", 8);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->meta.members.has_value());
  EXPECT_EQ(*c->meta.members, (std::vector<int>{0, 3}));
  EXPECT_EQ(c->meta.membership_version, 1);
  // An elastic job's records are a format older builds refuse.
  EXPECT_EQ(static_cast<uint8_t>(EncodeJob(elastic)[1]), kMembershipFormat);
  EXPECT_EQ(static_cast<uint8_t>(EncodeJob(Spec("b"))[1]), kStateFormat);
  // A backup image carries it; a delete removes it.
  auto images = store.LoadImages();
  ASSERT_TRUE(images.ok());
  EXPECT_EQ((*images)[0].job.membership, history);
  ASSERT_TRUE(store.DeleteJob("a").ok());
  ASSERT_TRUE(store.PutJob(elastic).ok());
  jobs = store.LoadAll();
  ASSERT_TRUE(jobs.ok());
  EXPECT_TRUE((*jobs)[0].membership.empty());
  ASSERT_TRUE(store.PutJobImage((*images)[0]).ok());
  jobs = store.LoadAll();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ((*jobs)[0].membership, history);
}

// A forward round whose stats_after are the layer's new statistics, as the
// aggregator commits it.
void CommitConsistent(StateStore& store, int64_t step, double x) {
  LayerSlot slot = Slot(x);
  slot.state.last_applied = step;
  slot.state.latest_completed = {step, step - 1};
  StoredRound round = Round(step);
  round.stats_after = slot.state.stats;
  ASSERT_TRUE(store.CommitRound("a", slot, round, {}).ok());
}

TEST(StateStoreTest, ForwardCommitStoresTheStatisticsOnceAndReloadsThem) {
  auto engine = std::make_unique<MemoryEngine>();
  MemoryEngine* raw = engine.get();
  KvStateStore store(std::move(engine));
  ASSERT_TRUE(store.PutJob(Spec("a")).ok());
  CommitConsistent(store, 5, 0.25);
  CommitConsistent(store, 6, -3.5);
  auto layer = raw->Get("l/a/0/0");
  ASSERT_TRUE(layer.ok() && layer->has_value());
  LayerState full = Slot(-3.5).state;
  full.last_applied = 6;
  EXPECT_LT((*layer)->size(), EncodeLayer(full).size());
  auto jobs = store.LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  const LayerState& loaded = (*jobs)[0].layers[0].slot.state;
  EXPECT_EQ(loaded.stats.num_batches_tracked, 3);
  EXPECT_EQ(loaded.stats.mean, (std::vector<double>{-3.5, 3.5}));
  EXPECT_EQ(loaded.stats.var, (std::vector<double>{1.5, 2.5}));
  EXPECT_EQ(loaded.last_applied, 6);
  // Any other commit (here one whose stats_after differ) stores them whole.
  ASSERT_TRUE(store.CommitRound("a", Slot(8), Round(7), {}).ok());
  jobs = store.LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ((*jobs)[0].layers[0].slot.state.stats.mean,
            (std::vector<double>{8, -8}));
}

// A BACKWARD round of step 3, backward `backward`, summing to `x`.
StoredRound Backward(int backward, double x) {
  StoredRound r;
  r.phase = Phase::kBackward;
  r.step = 3;
  r.backward = backward;
  r.outcome.version = 4;
  r.outcome.grad_sums = GradSums{{x, -x}, {2 * x, 0.5}};
  r.fingerprints = {static_cast<uint64_t>(backward), std::nullopt};
  return r;
}

TEST(StateStoreTest, SeveralBackwardsOfOneStepAreKeptApart) {
  // retain_graph=True: backwards 0, 1 and 2 through step 3's forward are
  // three rounds, each its own record; evicting one leaves the others.
  auto engine = std::make_unique<MemoryEngine>();
  MemoryEngine* raw = engine.get();
  KvStateStore store(std::move(engine));
  ASSERT_TRUE(store.PutJob(Spec("a")).ok());
  for (int b = 0; b < 3; ++b) {
    ASSERT_TRUE(
        store.CommitRound("a", Slot(1), Backward(b, 10.0 + b), {}).ok());
  }
  // The first keeps the key a round has always had.
  auto first = raw->Get("r/a/0/0/2/00000000000000000003");
  ASSERT_TRUE(first.ok() && first->has_value());
  auto third = raw->Get("r/a/0/0/2/00000000000000000003/2");
  ASSERT_TRUE(third.ok() && third->has_value());
  ASSERT_TRUE(store
                  .CommitRound("a", Slot(1), Backward(3, 13.0),
                               std::vector<RoundId>{RoundId{3, 1}})
                  .ok());
  auto jobs = store.LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  const std::vector<StoredRound>& rounds = (*jobs)[0].layers[0].rounds;
  ASSERT_EQ(rounds.size(), 3u);
  std::vector<int> kept;
  for (const StoredRound& r : rounds) {
    kept.push_back(r.backward);
    EXPECT_EQ(r.step, 3);
    EXPECT_EQ(r.outcome.grad_sums.sum_dy[0], 10.0 + r.backward);
    EXPECT_EQ(r.fingerprints[0], static_cast<uint64_t>(r.backward));
  }
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<int>{0, 2, 3}));
}

// Writes `value` under `key` behind the store's back.
void Poke(const std::string& dir, const std::string& key,
          const std::string& value) {
  rocksdb::DB* raw = nullptr;
  rocksdb::Options options;
  ASSERT_TRUE(rocksdb::DB::Open(options, dir, &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), key, value).ok());
}

// A stale-synchronous forward answer (rank 1, step 3) of a layer of 2
// channels.
StoredStaleAnswer StaleForwardAnswer() {
  StoredStaleAnswer a;
  a.key = StaleKey{0, 0, Phase::kForward, 3, 1};
  a.payload = Moments{2, {0.5, 1.5}, {0.25, 0.75}};
  a.fingerprint = 77;
  a.outcome.moments = GlobalMoments{4, {0.5, 1.5}, {1, 2}};
  a.outcome.version = 2;
  a.outcome.view = {ViewEntry{0, 3}, ViewEntry{1, 2}};
  return a;
}

std::string StaleAnswerBytes() {
  return EncodeStaleAnswer(StaleForwardAnswer());
}

TEST(StateStoreTest, StaleAnswersRoundTripAndGoWithTheirJob) {
  KvStateStore store(std::make_unique<MemoryEngine>());
  ASSERT_TRUE(store.PutJob(Spec("a")).ok());
  const StoredStaleAnswer first = StaleForwardAnswer();
  StoredStaleAnswer second = first;
  second.key = StaleKey{0, 0, Phase::kBackward, 4, 0};
  second.payload = GradSums{{1, 2}, {3, 4}};
  second.outcome = RoundOutcome();
  second.outcome.grad_sums = GradSums{{5, 6}, {7, 8}};
  ASSERT_TRUE(store.PutStaleAnswer("a", first, {}).ok());
  ASSERT_TRUE(store.PutStaleAnswer("a", second, {}).ok());
  auto jobs = store.LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ((*jobs)[0].stale.size(), 2u);
  const StoredStaleAnswer& f = (*jobs)[0].stale[0];
  EXPECT_EQ(f.key.step, 3);
  EXPECT_EQ(f.fingerprint, 77u);
  EXPECT_EQ(std::get<Moments>(f.payload).m2, (std::vector<double>{0.25, 0.75}));
  EXPECT_EQ(f.outcome.moments.var, (std::vector<double>{1, 2}));
  EXPECT_EQ(f.outcome.version, 2);
  EXPECT_TRUE(f.outcome.view == first.outcome.view);
  const StoredStaleAnswer& b = (*jobs)[0].stale[1];
  EXPECT_EQ(b.key.phase, Phase::kBackward);
  EXPECT_EQ(b.outcome.grad_sums.sum_dy_xmu, (std::vector<double>{7, 8}));
  // One write stores an answer and evicts older ones.
  ASSERT_TRUE(store.PutStaleAnswer("a", second, {first.key}).ok());
  jobs = store.LoadAll();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ((*jobs)[0].stale.size(), 1u);
  // A restore forgets them; a delete too.
  ASSERT_TRUE(store.PutStaleAnswer("a", first, {}).ok());
  ASSERT_TRUE(store.PutLayers("a", {Slot(1)}, /*drop_rounds=*/true).ok());
  jobs = store.LoadAll();
  ASSERT_TRUE(jobs.ok());
  EXPECT_TRUE((*jobs)[0].stale.empty());
}

TEST(StateStoreTest, BadRecordsAreDataLossNamingFolderAndKey) {
  struct Case {
    const char* what;
    std::string key, value;
  };
  LayerState three_channels;
  three_channels.stats = RunningStats{1, {1, 2, 3}, {1, 2, 3}};
  StoredRound newer = Round(5);
  std::string newer_bytes = EncodeLayer(Slot(1).state);
  LayerState in_lost_round = Slot(1).state;
  in_lost_round.last_applied = 77;
  newer_bytes[1] = 9;  // format field 1, varint value 1 -> 9
  StoredRound indexed_forward = Round(5);
  indexed_forward.backward = 1;
  const Case cases[] = {
      {"garbage layer", "l/a/0/0", "\xff\xff\xff garbage"},
      {"wrong channel count", "l/a/0/0", EncodeLayer(three_channels)},
      {"group out of range", "l/a/5/0", EncodeLayer(Slot(1).state)},
      {"statistics in a missing round", "l/a/0/0",
       EncodeLayer(in_lost_round, /*stats_in_round=*/true)},
      {"newer format", "l/a/0/0", newer_bytes},
      {"round under the wrong step", "r/a/0/0/1/00000000000000000007",
       EncodeRound(newer)},
      {"malformed key", "r/a/zero", "x"},
      {"backward round under the wrong index",
       "r/a/0/0/2/00000000000000000003/1", EncodeRound(Backward(2, 1.0))},
      {"first backward under an index", "r/a/0/0/2/00000000000000000003/0",
       EncodeRound(Backward(0, 1.0))},
      {"forward round of a backward index", "r/a/0/0/1/00000000000000000005",
       EncodeRound(indexed_forward)},
      {"garbage job", "j/c", "not a job"},
      {"garbage membership", "e/a", "\xff\xff not a membership"},
      {"membership rank out of range", "e/a",
       EncodeMembership({MembershipChange{0, 0, {0, 5}, {}, {}, {}, false}})},
      {"stale answer of a rank out of range",
       "s/a/0/0/1/00000000000000000003/5", StaleAnswerBytes()},
      {"membership out of order", "e/a",
       EncodeMembership({MembershipChange{1, 4, {0, 1}, {}, {}, {}, false},
                         MembershipChange{2, 3, {0}, {}, {1}, {}, false}})},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string dir = TempDir(absl::StrCat("bad", n++));
    {
      auto engine = RocksDbEngine::Open(dir, false);
      ASSERT_TRUE(engine.ok());
      KvStateStore store(*std::move(engine));
      Fill(store);
    }
    Poke(dir, c.key, c.value);
    auto engine = RocksDbEngine::Open(dir, false);
    ASSERT_TRUE(engine.ok()) << c.what << ": " << engine.status();
    KvStateStore store(*std::move(engine));
    absl::Status s = store.LoadAll().status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << c.what << ": " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), dir)) << c.what << ": " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), c.key)) << c.what << ": " << s;
  }
}

}  // namespace
}  // namespace syncnorm
