// The round log's recovery from damage, against a model of what was
// acknowledged: a torn last record may be dropped; any other damage, or a
// file shorter than it was made, stops Open with DATA_LOSS and changes
// nothing; the operator's point-in-time recovery drops what follows the
// damage; and whatever a recovery dropped never comes back, whatever is
// written after it (RocksDB's recyclable WAL records, PostgreSQL's refusal
// to start on a corrupt WAL).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/store/faulty_engine.h"
#include "server/store/memory_engine.h"
#include "server/store/ring_log_engine.h"

namespace syncnorm {
namespace {

using Model = std::map<std::string, std::string>;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path =
      absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
  std::remove(path.c_str());
  return path;
}

// Everything `engine` holds but the ring's own bookkeeping.
Model Contents(KvEngine& engine) {
  Model out;
  EXPECT_TRUE(engine
                  .Scan("k/",
                        [&out](absl::string_view k, absl::string_view v) {
                          out.emplace(std::string(k), std::string(v));
                          return absl::OkStatus();
                        })
                  .ok());
  return out;
}

// A round as the server writes one: a record of its own, under a key of a
// fixed width, with 100 bytes of value. Each is 24 + 4 + 9 + 4 + 100 = 141
// bytes, 144 in the ring: round i of a new ring starts at i * 144.
constexpr int64_t kRecord = 144;
KvBatch Round(int i, char fill) {
  KvBatch b;
  b.Put(absl::StrFormat("k/%02d", i), std::string(100, fill));
  return b;
}

void FlipByte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  const char c = static_cast<char>(f.get());
  f.seekp(offset);
  f.put(static_cast<char>(c ^ 0x20));
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

class RingLogRecoveryTest : public ::testing::Test {
 protected:
  // Opens the ring at path_ in front of memory_ (through a FaultyEngine
  // that injects nothing), which outlives it as a data_dir outlives the
  // process.
  absl::StatusOr<std::unique_ptr<RingLogEngine>> Open(
      RingLogRecovery recovery = RingLogRecovery::kTolerateTornTail) {
    RingLogOptions o = options_;
    o.recovery = recovery;
    return RingLogEngine::Open(path_, std::make_unique<FaultyEngine>(&memory_),
                               o);
  }

  // Writes rounds [from, to) with `fill`, then leaves the ring as kill -9
  // does; `model` gets them.
  void RoundsThenKill(int from, int to, char fill, Model& model) {
    auto e = Open();
    ASSERT_TRUE(e.ok()) << e.status();
    for (int i = from; i < to; ++i) {
      KvBatch b = Round(i, fill);
      ASSERT_TRUE((*e)->Write(b).ok());
      model[b.ops()[0].key] = b.ops()[0].value;
    }
    (*e)->AbandonForTest();
  }

  RingLogOptions options_ = [] {
    RingLogOptions o;
    o.ring_bytes = 256 << 10;
    o.min_lap_bytes = 64 << 10;
    o.flush_period = absl::Hours(1);  // flushes only by bytes
    return o;
  }();
  const std::string path_ = TempPath("ring");
  MemoryEngine memory_;
};

// The damage: 20 rounds acknowledged and not yet flushed, one
// payload byte of round 11 flipped. The start stops, naming the file, the
// offset and the 8 rounds after it; nothing changes. The operator accepts
// the loss; round 20 is written; after the next kill the old rounds 12..19
// stay gone and round 20 stays.
TEST_F(RingLogRecoveryTest, ADiscardedRecordNeverComesBack) {
  Model model;
  RoundsThenKill(0, 20, 'a', model);
  FlipByte(path_, 11 * kRecord + 100);
  const Model before = Contents(memory_);

  auto refused = Open();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), path_))
      << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                absl::StrCat("offset ", 11 * kRecord)))
      << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "8 valid newer"))
      << refused.status();
  EXPECT_EQ(Contents(memory_), before) << "a refused start changed the state";

  Model kept;
  {
    auto accepted = Open(RingLogRecovery::kPointInTime);
    ASSERT_TRUE(accepted.ok()) << accepted.status();
    ASSERT_TRUE((*accepted)->damage().has_value());
    EXPECT_EQ((*accepted)->damage()->records_after, 8);
    EXPECT_EQ((*accepted)->damage()->offset, 11 * kRecord);
    EXPECT_EQ((*accepted)->recovered_records(), 11);
    for (int i = 0; i < 11; ++i) {
      const std::string key = absl::StrFormat("k/%02d", i);
      kept[key] = model[key];
    }
    EXPECT_EQ(Contents(**accepted), kept);
    KvBatch b = Round(20, 'b');
    ASSERT_TRUE((*accepted)->Write(b).ok());
    kept[b.ops()[0].key] = b.ops()[0].value;
    (*accepted)->AbandonForTest();
  }
  auto again = Open();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE((*again)->damage().has_value());
  EXPECT_EQ((*again)->recovered_records(), 1);
  EXPECT_EQ(Contents(**again), kept) << "rounds dropped once came back";
}

// A flipped byte in a record's header (its sequence number) is damage as
// much as one in its payload.
TEST_F(RingLogRecoveryTest, ADamagedHeaderFollowedByRecordsIsDamage) {
  Model model;
  RoundsThenKill(0, 10, 'a', model);
  FlipByte(path_, 4 * kRecord + 9);  // round 4's sequence number
  auto refused = Open();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "5 valid newer"))
      << refused.status();
}

// Cut short after a kill: the start stops (how much was lost cannot be
// told); accepted, what the file still holds is replayed and the ring is
// made again at its size.
TEST_F(RingLogRecoveryTest, ATruncatedLogStopsTheStart) {
  Model model;
  RoundsThenKill(0, 20, 'a', model);
  ASSERT_EQ(::truncate(path_.c_str(), 6 * kRecord + 50), 0);
  auto refused = Open();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(
      refused.status().message(),
      absl::StrCat("but was made ", options_.ring_bytes, " bytes")))
      << refused.status();
  EXPECT_EQ(Contents(memory_), Model{});

  Model kept;
  for (int i = 0; i < 6; ++i) {
    const std::string key = absl::StrFormat("k/%02d", i);
    kept[key] = model[key];
  }
  {
    auto accepted = Open(RingLogRecovery::kPointInTime);
    ASSERT_TRUE(accepted.ok()) << accepted.status();
    ASSERT_TRUE((*accepted)->damage().has_value());
    EXPECT_TRUE((*accepted)->damage()->truncated());
    EXPECT_EQ(Contents(**accepted), kept);
    EXPECT_EQ(FileSize(path_), options_.ring_bytes);
    (*accepted)->AbandonForTest();
  }
  auto again = Open();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Contents(**again), kept);
}

// A file deleted: every record it held is lost, unless a clean close had
// handed all of them on.
TEST_F(RingLogRecoveryTest, AMissingLogStopsTheStartUnlessClosedCleanly) {
  Model model;
  RoundsThenKill(0, 5, 'a', model);
  ASSERT_EQ(std::remove(path_.c_str()), 0);
  auto refused = Open();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);

  auto accepted = Open(RingLogRecovery::kPointInTime);
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  KvBatch b = Round(7, 'c');
  ASSERT_TRUE((*accepted)->Write(b).ok());
  accepted->reset();  // a clean close
  ASSERT_EQ(std::remove(path_.c_str()), 0);
  auto clean = Open();
  ASSERT_TRUE(clean.ok()) << clean.status();
  EXPECT_EQ(Contents(**clean), (Model{{b.ops()[0].key, b.ops()[0].value}}));
}

// The last record torn (a kill in the middle of its write: never
// acknowledged) is dropped, and reported.
TEST_F(RingLogRecoveryTest, ATornLastRecordIsDroppedAndReported) {
  Model model;
  RoundsThenKill(0, 10, 'a', model);
  FlipByte(path_, 9 * kRecord + 120);
  auto e = Open();
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->recovered_records(), 9);
  ASSERT_TRUE((*e)->torn_tail().has_value());
  EXPECT_EQ((*e)->torn_tail()->offset, 9 * kRecord);
  EXPECT_FALSE((*e)->damage().has_value());
  model.erase("k/09");
  EXPECT_EQ(Contents(**e), model);
}

// Random damage over many lives of a small ring: byte flips anywhere,
// truncations, none. A start that succeeds without accepting a loss shows
// every acknowledged write (or all but the last, reported as a torn
// tail); one that refuses changes nothing; a loss accepted leaves the
// state as it was after some earlier write (flushes and records are whole
// and in order), which every later life starts from: nothing it dropped
// ever comes back.
TEST_F(RingLogRecoveryTest, RandomDamageNeverLosesAcknowledgedWritesSilently) {
  options_.ring_bytes = 64 << 10;
  options_.flush_bytes = 24 << 10;
  std::mt19937_64 rng(11);
  // The state after each write of the last life, the first before any.
  std::vector<Model> states = {Model{}};
  int refusals = 0, torn = 0, accepted_losses = 0;
  for (int life = 0; life < 150; ++life) {
    auto e = Open();
    if (!e.ok()) {
      ASSERT_EQ(e.status().code(), absl::StatusCode::kDataLoss) << e.status();
      const Model held = Contents(memory_);
      ++refusals;
      ASSERT_FALSE(Open().ok());
      ASSERT_EQ(Contents(memory_), held)
          << "life " << life << ": a refused start changed the state";
      e = Open(RingLogRecovery::kPointInTime);
      ASSERT_TRUE(e.ok()) << e.status();
      ASSERT_TRUE((*e)->damage().has_value());
      ++accepted_losses;
      const Model got = Contents(**e);
      ASSERT_TRUE(std::find(states.begin(), states.end(), got) != states.end())
          << "life " << life << ": the accepted state is no earlier state";
      states = {got};
    } else {
      const Model got = Contents(**e);
      const bool whole = got == states.back();
      const bool all_but_last = states.size() > 1 &&
                                (*e)->torn_tail().has_value() &&
                                got == states[states.size() - 2];
      ASSERT_TRUE(whole || all_but_last)
          << "life " << life << ": an acknowledged write was lost silently";
      if (!whole) ++torn;
      states = {got};
    }
    const int writes = 1 + static_cast<int>(rng() % 120);
    for (int i = 0; i < writes; ++i) {
      KvBatch b;
      Model next = states.back();
      const std::string key = absl::StrCat("k/", rng() % 50);
      if (rng() % 5 == 0) {
        b.Delete(key);
        next.erase(key);
      } else {
        std::string value(rng() % 1500, '\0');
        for (char& c : value) c = static_cast<char>(rng());
        b.Put(key, value);
        next[key] = value;
      }
      ASSERT_TRUE((*e)->Write(b).ok());
      states.push_back(std::move(next));
    }
    (*e)->AbandonForTest();
    e->reset();
    const int64_t size = FileSize(path_);
    switch (rng() % 4) {
      case 0:
        break;
      case 1:
        ASSERT_EQ(::truncate(path_.c_str(), static_cast<off_t>(rng() % size)),
                  0);
        break;
      default:
        FlipByte(path_, static_cast<int64_t>(rng() % size));
    }
  }
  EXPECT_GT(refusals, 10);
  std::printf("refusals %d, losses accepted %d, torn tails %d\n", refusals,
              accepted_losses, torn);
}

}  // namespace
}  // namespace syncnorm
