// The ring log against a reference: every write is also applied to a plain
// std::map, and whatever the engine shows (through Get, Scan, or after it
// is abandoned as a kill -9 leaves it and opened again) must equal the map.
#include "server/store/ring_log_engine.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/store/faulty_engine.h"
#include "server/store/memory_engine.h"

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

void Apply(const KvBatch& batch, Model& model) {
  for (const KvBatch::Op& op : batch.ops()) {
    switch (op.kind) {
      case KvBatch::Op::kPut:
        model[op.key] = op.value;
        break;
      case KvBatch::Op::kDelete:
        model.erase(op.key);
        break;
      case KvBatch::Op::kDeleteRange:
        model.erase(model.lower_bound(op.key), model.lower_bound(op.value));
        break;
    }
  }
}

// What the engine holds under "k/", by Scan.
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

// A 4 MiB ring whose laps may be as short as 256 KiB, flushed by bytes
// (and when full) only.
RingLogOptions ShortLaps() {
  RingLogOptions o;
  o.ring_bytes = 4 << 20;
  o.min_lap_bytes = 256 << 10;
  o.flush_period = absl::Hours(1);
  return o;
}

class RingLogEngineTest : public ::testing::Test {
 protected:
  // Opens the ring at path_ in front of memory_ (which outlives it, as a
  // data_dir outlives the process).
  std::unique_ptr<RingLogEngine> Open(RingLogOptions options) {
    faulty_ = new FaultyEngine(&memory_);
    auto e =
        RingLogEngine::Open(path_, std::unique_ptr<KvEngine>(faulty_), options);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? *std::move(e) : nullptr;
  }

  // A random batch of puts and deletes over `keys` keys of up to `max`
  // bytes each, after `held` was written. Half the puts of keys not held
  // then (KvBatch::Op::transient's contract) are transient.
  KvBatch RandomBatch(int keys, int max, const Model& held) {
    std::set<std::string> now;
    for (const auto& kv : held) now.insert(kv.first);
    KvBatch b;
    const int ops = 1 + static_cast<int>(rng_() % 4);
    for (int i = 0; i < ops; ++i) {
      std::string key = absl::StrCat("k/", rng_() % keys);
      if (rng_() % 4 == 0) {
        now.erase(key);
        b.Delete(std::move(key));
      } else {
        std::string value(rng_() % max, '\0');
        for (char& c : value) c = static_cast<char>(rng_());
        const bool transient = rng_() % 2 == 0 && now.count(key) == 0;
        now.insert(key);
        if (transient) {
          b.PutTransient(std::move(key), std::move(value));
        } else {
          b.Put(std::move(key), std::move(value));
        }
      }
    }
    return b;
  }

  // What reached the engine behind of the rounds' records.
  struct Reached {
    int64_t puts = -1;
    int64_t deletes = -1;
  };
  Reached RoundsThenKill(bool transient);

  const std::string path_ = TempPath("ring");
  MemoryEngine memory_;
  FaultyEngine* faulty_ = nullptr;  // owned by the engine
  std::mt19937_64 rng_{7};
};

TEST_F(RingLogEngineTest, ReadsSeeEveryWriteBeforeAndAfterAFlush) {
  RingLogOptions o;
  o.flush_period = absl::Hours(1);  // flushes only when asked
  auto e = Open(o);
  ASSERT_NE(e, nullptr);
  Model model;
  for (int i = 0; i < 200; ++i) {
    KvBatch b = RandomBatch(20, 300, model);
    ASSERT_TRUE(e->Write(b).ok());
    Apply(b, model);
    if (i == 100) {
      ASSERT_TRUE(e->Flush().ok());
    }
    for (int k = 0; k < 20; ++k) {
      const std::string key = absl::StrCat("k/", k);
      auto got = e->Get(key);
      ASSERT_TRUE(got.ok());
      auto want = model.find(key);
      ASSERT_EQ(got->has_value(), want != model.end()) << key << " at " << i;
      if (want != model.end()) {
        EXPECT_EQ(**got, want->second);
      }
    }
  }
  EXPECT_EQ(Contents(*e), model);
}

// The engine behind gets each write within the flush period, also the
// writes that follow a flush.
TEST_F(RingLogEngineTest, TheEngineBehindGetsWritesWithinThePeriod) {
  RingLogOptions o;
  o.flush_period = absl::Milliseconds(10);
  auto e = Open(o);
  ASSERT_NE(e, nullptr);
  for (int i = 0; i < 3; ++i) {
    KvBatch b;
    const std::string key = absl::StrCat("k/", i);
    b.Put(key, "v");
    ASSERT_TRUE(e->Write(b).ok());
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    absl::StatusOr<std::optional<std::string>> behind;
    do {
      absl::SleepFor(absl::Milliseconds(5));
      behind = memory_.Get(key);
      ASSERT_TRUE(behind.ok());
    } while (!behind->has_value() && absl::Now() < deadline);
    EXPECT_TRUE(behind->has_value()) << "write " << i << " never flushed";
  }
}

// Abandoned at random moments, over many laps of a small ring: every
// acknowledged write is there after the next Open, and nothing else.
TEST_F(RingLogEngineTest, AbandonedAnywhereLosesNoAcknowledgedWrite) {
  RingLogOptions o;
  o.ring_bytes = 64 << 10;
  o.flush_bytes = 16 << 10;
  o.flush_period = absl::Milliseconds(1);
  Model model;
  int64_t written = 0, replayed = 0;
  for (int life = 0; life < 12; ++life) {
    auto e = Open(o);
    ASSERT_NE(e, nullptr);
    replayed += e->recovered_records();
    ASSERT_EQ(Contents(*e), model) << "after life " << life;
    const int writes = 50 + static_cast<int>(rng_() % 400);
    for (int i = 0; i < writes; ++i) {
      KvBatch b = RandomBatch(40, 2000, model);
      ASSERT_TRUE(e->Write(b).ok());
      Apply(b, model);
      written += 2000;
    }
    e->AbandonForTest();
  }
  auto e = Open(o);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(Contents(*e), model);
  EXPECT_GT(written, 20 * o.ring_bytes) << "the ring went round many times";
  EXPECT_GT(replayed, 0) << "some lives ended with records not flushed";
}

// With sync_writes each record (and the pad before a wrap) is msynced
// before the write returns; over several laps none fails, and all is there.
TEST_F(RingLogEngineTest, SyncedWritesOverManyLaps) {
  RingLogOptions o;
  o.ring_bytes = 64 << 10;
  o.flush_bytes = 16 << 10;
  o.flush_period = absl::Milliseconds(1);
  o.sync_writes = true;
  Model model;
  {
    auto e = Open(o);
    ASSERT_NE(e, nullptr);
    for (int i = 0; i < 300; ++i) {
      KvBatch b = RandomBatch(40, 2000, model);
      const absl::Status s = e->Write(b);
      ASSERT_TRUE(s.ok()) << s;
      Apply(b, model);
    }
    e->AbandonForTest();
  }
  auto e = Open(o);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(Contents(*e), model);
}

// A record cut short (a kill inside its pwrite: never acknowledged) ends
// the replay; what came before it is there.
TEST_F(RingLogEngineTest, ATornRecordEndsTheReplay) {
  RingLogOptions o;
  o.flush_period = absl::Hours(1);
  Model model;
  int64_t tail = 0;
  {
    auto e = Open(o);
    ASSERT_NE(e, nullptr);
    for (int i = 0; i < 10; ++i) {
      KvBatch b;
      b.Put(absl::StrCat("k/", i), std::string(100, 'a' + i));
      ASSERT_TRUE(e->Write(b).ok());
      if (i < 9) Apply(b, model);
    }
    e->AbandonForTest();
    // Records are 24 + 4 + 9 + 3 + 100 = 140 bytes, padded to 144: the
    // last starts at 9 * 144. Its last byte of payload flips.
    tail = 9 * 144 + 139;
  }
  std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(tail);
  char c = static_cast<char>(f.get());
  f.seekp(tail);
  f.put(static_cast<char>(c ^ 0x40));
  f.close();
  auto e = Open(o);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->recovered_records(), 9);
  EXPECT_EQ(Contents(*e), model);
}

// A kill with the ring full of rewrites of a few keys (a layer's state
// every round): the replay hands the engine behind each key once, not
// every record's (a 32 MiB ring once replayed as one 32 MiB batch, more
// than a nearly full disk would take).
TEST_F(RingLogEngineTest, TheReplayWritesEachKeyOnce) {
  RingLogOptions o;
  o.ring_bytes = 1 << 20;
  o.flush_bytes = o.ring_bytes / 2;
  o.flush_period = absl::Hours(1);
  Model model;
  {
    auto e = Open(o);
    ASSERT_NE(e, nullptr);
    for (int i = 0; i < 300; ++i) {
      KvBatch b;
      b.Put("k/state", std::string(1000, static_cast<char>('a' + i % 26)));
      b.Put(absl::StrCat("k/round/", i), std::string(500, 'r'));
      if (i >= 8) b.Delete(absl::StrCat("k/round/", i - 8));
      ASSERT_TRUE(e->Write(b).ok());
      Apply(b, model);
    }
    e->AbandonForTest();
  }
  auto e = Open(o);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->recovered_records(), 300);
  EXPECT_EQ(Contents(*e), model);
  // The state, 300 round keys (8 put, the rest deleted), the position.
  EXPECT_EQ(faulty_->largest_batch(), 1u + 300u + 1u);
}

// Rounds kept for retries, as the state store writes them: each round puts
// its record and the layer's state, and deletes the record of 8 rounds
// before; then a kill. Returns the puts and deletes of records that reached
// the engine behind; after the kill, all of it must be there all the same.
RingLogEngineTest::Reached RingLogEngineTest::RoundsThenKill(bool transient) {
  RingLogOptions o;
  o.ring_bytes = 256 << 10;
  o.flush_bytes = o.ring_bytes / 2;
  o.flush_period = absl::Hours(1);  // by bytes only
  Model model;
  Reached reached;
  {
    auto e = Open(o);
    EXPECT_NE(e, nullptr);
    if (e == nullptr) return reached;
    // 12 KB a round: a flush every ~11 rounds (128 KB), so most records
    // outlive the flush after them; 8 rounds (96 KB) fit in the newest
    // half of the ring, where a transient put is carried.
    for (int i = 0; i < 2000; ++i) {
      KvBatch b;
      std::string record(12000, static_cast<char>('a' + i % 26));
      if (transient) {
        b.PutTransient(absl::StrCat("k/round/", i), std::move(record));
      } else {
        b.Put(absl::StrCat("k/round/", i), std::move(record));
      }
      b.Put("k/state", absl::StrCat("state after ", i));
      if (i >= 8) b.Delete(absl::StrCat("k/round/", i - 8));
      EXPECT_TRUE(e->Write(b).ok());
      Apply(b, model);
      // Reads see every write, carried or not.
      if (i % 97 == 0) {
        auto got = e->Get(absl::StrCat("k/round/", i));
        EXPECT_TRUE(got.ok() && got->has_value());
        if (got.ok() && got->has_value()) {
          EXPECT_EQ(**got, model[absl::StrCat("k/round/", i)]);
        }
      }
    }
    reached.puts = faulty_->puts("k/round/");
    reached.deletes = faulty_->deletes("k/round/");
    e->AbandonForTest();  // kill -9: carried records only in the ring
  }
  auto e = Open(o);
  EXPECT_NE(e, nullptr);
  if (e != nullptr) {
    EXPECT_EQ(Contents(*e), model);
  }
  return reached;
}

// A transient put deleted before it leaves the newest half of the ring
// never reaches the engine behind, and neither does its delete: there is
// nothing there to delete (a RocksDB tombstone per round, before).
TEST_F(RingLogEngineTest, TransientPutsDeletedSoonStayOutOfTheEngineBehind) {
  const Reached reached = RoundsThenKill(/*transient=*/true);
  EXPECT_EQ(reached.puts, 0);
  // 1,990 of the 1,992 deletes reached it before. One that comes while the
  // flusher writes a batch holding the put (carried, so not in that batch)
  // still goes (2% of them here; more on a slower machine).
  EXPECT_LT(reached.deletes, 1992 / 2);
}

// A delete of a key the engine behind holds must reach it, though a
// transient put of the key (allowed once the key is deleted) came between
// the delete and the next flush, or the flush that had the delete failed.
TEST_F(RingLogEngineTest, ADeleteReachesTheEngineBehindPastATransientPut) {
  RingLogOptions o;
  o.flush_period = absl::Hours(1);  // flushes only when asked
  for (const bool failed_flush : {false, true}) {
    SCOPED_TRACE(failed_flush ? "the delete's flush failed" : "no failure");
    const std::string key = absl::StrCat("k/round-", failed_flush);
    auto e = Open(o);
    ASSERT_NE(e, nullptr);
    KvBatch put;
    put.Put(key, "old");
    ASSERT_TRUE(e->Write(put).ok());
    ASSERT_TRUE(e->Flush().ok());  // the engine behind holds the key
    KvBatch del;
    del.Delete(key);
    ASSERT_TRUE(e->Write(del).ok());
    if (failed_flush) {
      faulty_->fail_writes(true);
      EXPECT_FALSE(e->Flush().ok());
      faulty_->fail_writes(false);
    }
    KvBatch again;
    again.PutTransient(key, "new");
    ASSERT_TRUE(e->Write(again).ok());
    ASSERT_TRUE(e->Write(del).ok());
    auto got = e->Get(key);
    ASSERT_TRUE(got.ok());
    EXPECT_FALSE(got->has_value());
    ASSERT_TRUE(e->Flush().ok());
    auto behind = memory_.Get(key);
    ASSERT_TRUE(behind.ok());
    EXPECT_FALSE(behind->has_value()) << **behind;
  }
}

// The same rounds with plain puts: every record that a flush finds alive
// reaches the engine behind (about 40% of them here), and so do deletes.
TEST_F(RingLogEngineTest, PlainPutsReachTheEngineBehind) {
  const Reached reached = RoundsThenKill(/*transient=*/false);
  EXPECT_GT(reached.puts, 400);
  EXPECT_GT(reached.deletes, 400);
}

// The bytes of the ring's file from `from` on that are not zero.
int64_t NonZeroFrom(const std::string& path, int64_t from) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(from);
  int64_t n = 0;
  char c;
  while (in.get(c)) n += c != '\0';
  return n;
}

// Laps shorter than the file: each wraps at four times what the ring
// holds (a retry window of 8 records of 16 KB: a 1 MiB lap), padded to the
// file's end. The rest of the file is never written; records carried by a
// flush stay out of the engine behind, as in a full-length lap; a kill at
// any point loses nothing, the padding replayed as the file's end.
TEST_F(RingLogEngineTest, ALapSpansWhatTheRingHolds) {
  const RingLogOptions o = ShortLaps();
  Model model;
  int round = 0;
  for (int life = 0; life < 4; ++life) {
    auto e = Open(o);
    ASSERT_NE(e, nullptr);
    ASSERT_EQ(Contents(*e), model) << "after life " << life;
    // The replay wrote the live records of the life before.
    const int64_t replayed = faulty_->puts("k/round/");
    const int rounds = 300 + static_cast<int>(rng_() % 300);
    for (int i = 0; i < rounds; ++i, ++round) {
      KvBatch b;
      b.PutTransient(absl::StrCat("k/round/", round),
                     std::string(16000, static_cast<char>('a' + round % 26)));
      b.Put("k/state", absl::StrCat("state after ", round));
      if (round >= 8) b.Delete(absl::StrCat("k/round/", round - 8));
      ASSERT_TRUE(e->Write(b).ok());
      Apply(b, model);
    }
    EXPECT_EQ(faulty_->puts("k/round/"), replayed) << "life " << life;
    e->AbandonForTest();
  }
  EXPECT_GT(round, 4 * 64) << "many laps of 1 MiB";
  EXPECT_EQ(NonZeroFrom(path_, 2 << 20), 0);
  auto e = Open(o);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(Contents(*e), model);
}

// A retry window larger than the shortest lap (40 records of 16 KB) makes
// the lap go on instead of wrapping, until it holds four times the window:
// its records are carried, never written to the engine behind, as with
// laps of the whole file.
TEST_F(RingLogEngineTest, LapsGrowWithWhatTheRingHolds) {
  const RingLogOptions o = ShortLaps();
  auto e = Open(o);
  ASSERT_NE(e, nullptr);
  Model model;
  for (int i = 0; i < 1200; ++i) {
    KvBatch b;
    b.PutTransient(absl::StrCat("k/round/", i),
                   std::string(16000, static_cast<char>('a' + i % 26)));
    if (i >= 40) b.Delete(absl::StrCat("k/round/", i - 40));
    ASSERT_TRUE(e->Write(b).ok());
    Apply(b, model);
  }
  EXPECT_EQ(faulty_->puts("k/round/"), 0);
  EXPECT_GT(NonZeroFrom(path_, 2 << 20), 0) << "laps of the whole file";
  EXPECT_EQ(Contents(*e), model);
}

// transient_bytes(): what was logged is what the test put; what spilled is
// exactly what the engine behind got for room (counted there), none while
// the window fits, all of a write through, and nothing of an explicit
// Flush.
TEST_F(RingLogEngineTest, CountsTheTransientBytesThatReachTheEngineBehind) {
  const RingLogOptions o = ShortLaps();
  auto e = Open(o);
  ASSERT_NE(e, nullptr);
  constexpr int64_t kValue = 16000;
  int64_t put = 0;
  auto write = [&](const std::string& key, int64_t bytes,
                   const std::string& deleted) {
    KvBatch b;
    b.PutTransient(key, std::string(bytes, 'v'));
    b.Put("k/state", key);
    if (!deleted.empty()) b.Delete(deleted);
    put += bytes;
    return e->Write(b);
  };
  // A window of 40 records (640 KB) fits in half the ring.
  for (int i = 0; i < 1200; ++i) {
    ASSERT_TRUE(write(absl::StrCat("k/a/", i), kValue,
                      i >= 40 ? absl::StrCat("k/a/", i - 40) : "")
                    .ok());
  }
  EXPECT_EQ(e->transient_bytes().logged, put);
  EXPECT_EQ(e->transient_bytes().spilled, 0);
  EXPECT_EQ(faulty_->puts("k/a/"), 0);
  // A window of 200 (3.2 MB) does not.
  for (int i = 0; i < 1200; ++i) {
    ASSERT_TRUE(write(absl::StrCat("k/b/", i), kValue,
                      i >= 200 ? absl::StrCat("k/b/", i - 200) : "")
                    .ok());
  }
  // The flusher may still have a flush to begin or to finish; once it is
  // idle, no write starts another.
  auto spilled_there = [&] {
    return (faulty_->puts("k/a/") + faulty_->puts("k/b/")) * kValue;
  };
  e->WaitForFlusherForTest();
  const RingLogEngine::TransientBytes b = e->transient_bytes();
  EXPECT_EQ(b.logged, put);
  EXPECT_GT(faulty_->puts("k/b/"), 600);
  EXPECT_EQ(b.spilled, spilled_there());
  // An explicit flush hands on the rest, but not for room.
  ASSERT_TRUE(e->Flush().ok());
  EXPECT_GT(spilled_there(), b.spilled);
  EXPECT_EQ(e->transient_bytes().spilled, b.spilled);
  // A record over a quarter of the ring goes straight through.
  ASSERT_TRUE(write("k/c/0", 1100 << 10, "").ok());
  EXPECT_EQ(e->transient_bytes().logged, put);
  EXPECT_EQ(e->transient_bytes().spilled, b.spilled + (1100 << 10));
}

// Random batches, killed anywhere, with laps wrapping before the file's
// end (about 500 KB of 1 MiB).
TEST_F(RingLogEngineTest, AbandonedAnywhereInShortLapsLosesNothing) {
  RingLogOptions o;
  o.ring_bytes = 1 << 20;
  o.min_lap_bytes = 64 << 10;
  o.flush_bytes = 64 << 10;
  o.flush_period = absl::Milliseconds(1);
  Model model;
  int64_t replayed = 0;
  for (int life = 0; life < 12; ++life) {
    auto e = Open(o);
    ASSERT_NE(e, nullptr);
    replayed += e->recovered_records();
    ASSERT_EQ(Contents(*e), model) << "after life " << life;
    const int writes = 200 + static_cast<int>(rng_() % 1500);
    for (int i = 0; i < writes; ++i) {
      KvBatch b = RandomBatch(40, 2000, model);
      ASSERT_TRUE(e->Write(b).ok());
      Apply(b, model);
    }
    e->AbandonForTest();
  }
  auto e = Open(o);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(Contents(*e), model);
  EXPECT_GT(replayed, 0) << "some lives ended with records not flushed";
  EXPECT_EQ(NonZeroFrom(path_, 900 << 10), 0) << "no lap reached the end";
}

// A range deletion goes to the engine behind, after what the ring holds
// and before what follows.
TEST_F(RingLogEngineTest, RangeDeletionsLandInOrder) {
  RingLogOptions o;
  o.flush_period = absl::Hours(1);
  auto e = Open(o);
  ASSERT_NE(e, nullptr);
  Model model;
  KvBatch a, range, c;
  a.Put("k/a1", "1");
  a.Put("k/b1", "2");
  range.DeleteRange("k/a", "k/b");
  range.Put("k/a2", "3");
  c.Put("k/a3", "4");
  c.Delete("k/b1");
  for (const KvBatch* b : {&a, &range, &c}) {
    ASSERT_TRUE(e->Write(*b).ok());
    Apply(*b, model);
  }
  EXPECT_EQ(Contents(*e), model);
  e->AbandonForTest();
  e = Open(o);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(Contents(*e), model);
}

// The engine behind refuses (a full disk): writes go on into the ring
// until it is full, then fail with that error and apply nothing; once it
// takes writes again, everything acknowledged is there.
TEST_F(RingLogEngineTest, ARefusingEngineStopsWritesOnlyOnceTheRingIsFull) {
  RingLogOptions o;
  o.ring_bytes = 64 << 10;
  o.flush_bytes = 8 << 10;
  o.flush_period = absl::Milliseconds(1);
  auto e = Open(o);
  ASSERT_NE(e, nullptr);
  faulty_->fail_writes(true);
  Model model;
  absl::Status refused;
  int accepted = 0;
  for (int i = 0; i < 1000 && refused.ok(); ++i) {
    KvBatch b;
    b.Put(absl::StrCat("k/", i), std::string(1000, 'x'));
    refused = e->Write(b);
    if (refused.ok()) {
      Apply(b, model);
      ++accepted;
    }
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  // About the ring's worth of 1 KiB records.
  EXPECT_GT(accepted, 40);
  EXPECT_LT(accepted, 70);
  faulty_->fail_writes(false);
  EXPECT_EQ(Contents(*e), model);
  KvBatch more;
  more.Put("k/after", "y");
  ASSERT_TRUE(e->Write(more).ok());
  Apply(more, model);
  e->AbandonForTest();
  e = Open(o);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(Contents(*e), model);
}

// Writers on several threads while the flusher runs: the final state is
// each thread's last write of its keys.
TEST_F(RingLogEngineTest, ConcurrentWritersAndFlushes) {
  RingLogOptions o;
  o.ring_bytes = 256 << 10;
  o.flush_bytes = 16 << 10;
  o.flush_period = absl::Milliseconds(1);
  auto e = Open(o);
  ASSERT_NE(e, nullptr);
  constexpr int kThreads = 4, kWrites = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&e, t] {
      for (int i = 0; i < kWrites; ++i) {
        KvBatch b;
        b.Put(absl::StrCat("k/", t, "/", i % 10), absl::StrCat(i));
        EXPECT_TRUE(e->Write(b).ok());
        if (i % 100 == 0) {
          auto got = e->Get(absl::StrCat("k/", t, "/", i % 10));
          EXPECT_TRUE(got.ok() && got->has_value() && **got == absl::StrCat(i));
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  Model model;
  for (int t = 0; t < kThreads; ++t) {
    for (int k = 0; k < 10; ++k) {
      model[absl::StrCat("k/", t, "/", k)] = absl::StrCat(kWrites - 10 + k);
    }
  }
  EXPECT_EQ(Contents(*e), model);
  e->AbandonForTest();
  e = Open(o);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(Contents(*e), model);
}

// Another ring size (a changed setting) keeps what the old ring held.
TEST_F(RingLogEngineTest, ANewRingSizeKeepsWhatTheOldOneHeld) {
  RingLogOptions small;
  small.ring_bytes = 64 << 10;
  small.flush_period = absl::Hours(1);
  Model model;
  {
    auto e = Open(small);
    ASSERT_NE(e, nullptr);
    for (int i = 0; i < 30; ++i) {
      KvBatch b = RandomBatch(10, 500, model);
      ASSERT_TRUE(e->Write(b).ok());
      Apply(b, model);
    }
    e->AbandonForTest();
  }
  RingLogOptions large = small;
  large.ring_bytes = 128 << 10;
  auto e = Open(large);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->recovered_records(), 30);
  EXPECT_EQ(Contents(*e), model);
  struct stat st;
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, large.ring_bytes);
  KvBatch b = RandomBatch(10, 500, model);
  ASSERT_TRUE(e->Write(b).ok());
  Apply(b, model);
  e->AbandonForTest();
  e = Open(large);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(Contents(*e), model);
}

// The kB of the mapping of `path` that this process maps in huge pages
// (FilePmdMapped in /proc/self/smaps); -1 if `path` is not mapped.
int64_t HugeMappedKb(const std::string& path) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in = false;
  int64_t kb = -1;
  while (std::getline(smaps, line)) {
    // A mapping's first line, "start-end perms offset dev inode [path]",
    // is the only kind whose first word holds a '-'.
    if (line.find('-') < line.find(' ')) {
      in = absl::EndsWith(line, " " + path);
      if (in && kb < 0) kb = 0;
    } else if (in && absl::StartsWith(line, "FilePmdMapped:")) {
      kb += std::strtoll(line.c_str() + 14, nullptr, 10);
    }
  }
  return kb;
}

// Whether this kernel and file system map a file's pages in huge pages:
// a file written in aligned 2 MiB pieces, so that its page cache folios
// are 2 MiB where they can be, mapped with MADV_HUGEPAGE and touched.
bool FilesMapInHugePages(const std::string& path) {
  constexpr size_t kSize = 4 << 20, kPiece = 2 << 20;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return false;
  const std::string piece(kPiece, 'x');
  bool ok = true;
  for (size_t at = 0; ok && at < kSize; at += kPiece) {
    ok = ::pwrite(fd, piece.data(), kPiece, static_cast<off_t>(at)) ==
         static_cast<ssize_t>(kPiece);
  }
  void* map =
      ok ? ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
         : MAP_FAILED;
  int64_t kb = 0;
  if (map != MAP_FAILED) {
    ::madvise(map, kSize, MADV_HUGEPAGE);
    for (size_t at = 0; at < kSize; at += 4096) {
      volatile char* byte = static_cast<char*>(map) + at;
      *byte = *byte;
    }
    kb = HugeMappedKb(path);
    ::munmap(map, kSize);
  }
  ::close(fd);
  std::remove(path.c_str());
  return kb > 0;
}

// A record's copy into the ring goes through one TLB entry per 2 MiB
// where the kernel allows it, for a new ring (written through in 1 MiB
// pieces, which leaves 4 KiB folios in the page cache) and for one opened
// again whose pages the last process left in the cache.
TEST_F(RingLogEngineTest, TheRingIsMappedInHugePagesWhereTheKernelCan) {
  if (!FilesMapInHugePages(TempPath("huge-probe"))) {
    GTEST_SKIP() << "this kernel or file system maps no file in huge pages";
  }
  RingLogOptions o = ShortLaps();
  auto e = Open(o);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(HugeMappedKb(path_), o.ring_bytes / 1024);
  Model model;
  for (int i = 0; i < 50; ++i) {
    KvBatch b = RandomBatch(20, 3000, model);
    ASSERT_TRUE(e->Write(b).ok());
    Apply(b, model);
  }
  e.reset();
  ASSERT_EQ(HugeMappedKb(path_), -1);
  e = Open(o);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(HugeMappedKb(path_), o.ring_bytes / 1024);
  EXPECT_EQ(Contents(*e), model);
}

}  // namespace
}  // namespace syncnorm
