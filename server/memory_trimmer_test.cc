// TrimPolicy against its rule worked by hand; MemoryTrimmer against the
// kernel's count of the process's resident memory (/proc/self/status) and
// minor faults: heap that a burst freed between blocks still live stays
// resident until the trimmer runs, and then goes back; heap that rounds
// use again and again stays.
#include "server/memory_trimmer.h"

#include <malloc.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace syncnorm {
namespace {

constexpr int kSamples = TrimPolicy::kSamples;
constexpr int kWindow = TrimPolicy::kWindow;

struct Mem {
  int64_t resident = 0;
  int64_t in_use = 0;
};

// A period of samples: `at` at every sample but one, where it is `peak`
// (resident 0: none such). Returns whether the period's end said to trim;
// no other sample may.
bool Period(TrimPolicy& policy, Mem at, Mem peak = {}) {
  for (int i = 0; i < kSamples - 1; ++i) {
    const Mem m = i == kSamples / 2 && peak.resident > 0 ? peak : at;
    EXPECT_FALSE(policy.Sample(m.resident, m.in_use))
        << "a sample inside a period said to trim";
  }
  return policy.Sample(at.resident, at.in_use);
}

// In the tests below the process holds 200 beyond its heap in use; its
// heap is at least 100 in use.

// The benchmark's servers live 15 s: the working set counts from the
// first period, or their rounds' heap is trimmed all along (9 minor
// faults per contribution at W = 4096, C = 2048, where 3 is the floor).
TEST(TrimPolicyTest, CountsTheWorkingSetFromTheFirstPeriod) {
  TrimPolicy policy;
  // The process may hold 200 + 5/4 of the 100 in use.
  EXPECT_FALSE(Period(policy, {300, 100}));
  EXPECT_FALSE(Period(policy, {325, 100}));
  EXPECT_TRUE(Period(policy, {326, 100}));
}

// The failure of stop 39: the working set was the most heap in use at any
// moment of the last 30 s, so a flood's memory counted as the working set
// that long, and the next flood started on it (the read-flood watchdog
// judges what resident memory grows) and grew past the flood test's bound.
TEST(TrimPolicyTest, TrimsWhatABurstLeftAtTheEndOfThePeriodItEnds) {
  TrimPolicy policy;
  for (int p = 0; p < kWindow; ++p) Period(policy, {300, 100});
  // A burst of 900 more in use within one period, left resident.
  EXPECT_TRUE(Period(policy, {1200, 100}, /*peak=*/{1200, 1000}));
  EXPECT_FALSE(Period(policy, {300, 100})) << "trimmed";
  // One still in use at the period's end: trimmed at the next.
  EXPECT_TRUE(Period(policy, {1200, 1000}));  // nothing to give back yet
  EXPECT_TRUE(Period(policy, {1200, 100}));
  EXPECT_FALSE(Period(policy, {300, 100})) << "trimmed";
  // A burst in use over two periods.
  for (int p = 0; p < kWindow; ++p) Period(policy, {300, 100});
  Period(policy, {1200, 1000});
  Period(policy, {1200, 1000});
  EXPECT_TRUE(Period(policy, {1200, 100}));
  // Heap a trim cannot give back is not tried again and again: once the
  // burst's periods have left the window, it counts as held beyond.
  EXPECT_TRUE(Period(policy, {1200, 100}));
  EXPECT_FALSE(Period(policy, {1200, 100}));
}

// A wide job: every period has a round with 1000 in use, and between
// rounds the 900 it freed stays resident. That is the working set.
TEST(TrimPolicyTest, KeepsWhatEveryPeriodUses) {
  TrimPolicy policy;
  for (int p = 0; p < kWindow; ++p) {
    Period(policy, {1200, 100}, /*peak=*/{1200, 1000});
  }
  for (int p = 0; p < 4 * kWindow; ++p) {
    EXPECT_FALSE(Period(policy, {1200, 100}, /*peak=*/{1200, 1000}))
        << "period " << p;
  }
  // The job ends: after one period without a round, its heap goes back.
  EXPECT_TRUE(Period(policy, {1200, 100}));
}

TEST(TrimPolicyTest, ForgetsWhatClosedConnectionsHeld) {
  TrimPolicy policy;
  // A flood in every period: as far as memory shows, a working set.
  for (int p = 0; p < 2 * kWindow; ++p) {
    Period(policy, {1200, 100}, /*peak=*/{1200, 1000});
  }
  EXPECT_FALSE(Period(policy, {1200, 100}, /*peak=*/{1200, 1000}));
  // The server closed its connection: trimmed at the period's end, and
  // while the next kWindow periods fill the window again.
  policy.Forget();
  for (int p = 0; p < kWindow - 1; ++p) {
    EXPECT_TRUE(Period(policy, {1200, 100}, /*peak=*/{1200, 1000}))
        << "period " << p;
  }
  EXPECT_FALSE(Period(policy, {1200, 100}, /*peak=*/{1200, 1000}));
}

int64_t ResidentKb() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

int64_t MinorFaults() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// A burst (a flood, a large message) in a server whose heap otherwise
// stays put: what it leaves goes back within a period of its end. The
// trimmer of stop 39 kept the most in use of the last 6 periods, so it
// kept a burst's leftover for 6 periods.
TEST(MemoryTrimmerTest, GivesABurstsLeftoverBackWithinAPeriodOfItsEnd) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator serves malloc, not glibc's";
#endif
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  constexpr absl::Duration kPeriod = absl::Milliseconds(200);
  constexpr int kBlocks = 4096;
  constexpr size_t kBlockBytes = 16 << 10;  // 64 MiB
  constexpr int64_t kFreedKb = kBlocks / 16 * 15 * (kBlockBytes >> 10);
  MemoryTrimmer trimmer(kPeriod);
  // The window fills with the test's steady heap.
  absl::SleepFor(kPeriod * (TrimPolicy::kWindow + 1));
  const int64_t start = ResidentKb();
  std::vector<void*> kept;
  int64_t freed = 0;
  absl::Time freed_at;
  // On a thread of its own, so in an arena of its own, as the server's
  // threads allocate. Every 16th block stays live, the last one among
  // them: what lies between is free, but not at the top of the arena,
  // where glibc would give it back by itself.
  std::thread([&] {
    std::vector<void*> blocks;
    for (int i = 0; i < kBlocks; ++i) {
      blocks.push_back(std::malloc(kBlockBytes));
      std::memset(blocks.back(), 1, kBlockBytes);
    }
    absl::SleepFor(kPeriod / 2);  // samples see it in use
    for (int i = 0; i < kBlocks; ++i) {
      if (i % 16 == 15) {
        kept.push_back(blocks[i]);
      } else {
        std::free(blocks[i]);
      }
    }
    freed = ResidentKb();
    freed_at = absl::Now();
  }).join();
  EXPECT_GE(freed - start, kFreedKb * 3 / 4)
      << "glibc gave the freed heap back by itself: the test shows nothing";
  // By the end of the period after the one it ended in, at the latest; the
  // old trimmer waited 6 periods.
  const absl::Time deadline = freed_at + kPeriod * 3.5;
  int64_t trimmed = freed;
  while (freed - trimmed < kFreedKb * 3 / 4 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
    trimmed = ResidentKb();
  }
  const absl::Duration took = absl::Now() - freed_at;
  EXPECT_GE(freed - trimmed, kFreedKb * 3 / 4)
      << "resident " << freed << " kB after the burst, " << trimmed << " kB "
      << took << " later";
  for (void* p : kept) std::free(p);
}

// A wide job's rounds: a working set allocated, used and freed again and
// again, in every period, with the trimmer looking between rounds. Giving
// it back each time makes the next round fault every page in again.
TEST(MemoryTrimmerTest, LeavesTheHeapThatRoundsUseAgainAndAgain) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator serves malloc, not glibc's";
#endif
  // As server/main.cc: glibc itself keeps the top of the heap too.
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  constexpr int kBlocks = 2048;
  constexpr size_t kBlockBytes = 16 << 10;  // 32 MiB a round
  constexpr int kRounds = 24;
  constexpr int64_t kPages = kBlocks * (kBlockBytes / 4096);
  // A round every ~160 ms: one in every period, and most periods end
  // between two rounds, with the round's heap free.
  MemoryTrimmer trimmer(absl::Milliseconds(200));
  int64_t faults = 0;
  std::thread([&faults] {
    std::vector<void*> blocks(kBlocks);
    std::vector<void*> kept;
    for (int round = 0; round < kRounds; ++round) {
      // The first rounds fault the working set in, and fill the window.
      const int64_t before = MinorFaults();
      for (void*& b : blocks) {
        b = std::malloc(kBlockBytes);
        std::memset(b, 1, kBlockBytes);
      }
      absl::SleepFor(absl::Milliseconds(50));  // sampled every 20 ms
      // Every 16th block outlives its round (the round's records, say), so
      // the rest is freed between live blocks, not at the arena's top.
      for (void* b : kept) std::free(b);
      kept.clear();
      for (int i = 0; i < kBlocks; ++i) {
        if (i % 16 == 15) {
          kept.push_back(blocks[i]);
        } else {
          std::free(blocks[i]);
        }
      }
      absl::SleepFor(absl::Milliseconds(100));
      if (round >= kRounds / 2) faults += MinorFaults() - before;
    }
    for (void* b : kept) std::free(b);
  }).join();
  const int64_t per_round = faults / (kRounds - kRounds / 2);
  EXPECT_LT(per_round, kPages / 4)
      << "the trimmer gave the rounds' heap back between them: " << per_round
      << " minor faults a round of " << kPages << " pages";
}

}  // namespace
}  // namespace syncnorm
