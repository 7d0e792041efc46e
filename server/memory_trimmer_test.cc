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
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
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

// A wide job's rounds: each takes the heap to 1000 in use, and between
// them the 900 they freed stays resident. Kept from the first round on.
TEST(TrimPolicyTest, KeepsWhatRoundsUseAgainAndAgain) {
  TrimPolicy policy;
  for (int p = 0; p < 4 * kWindow; ++p) {
    EXPECT_FALSE(Period(policy, {1200, 100}, /*peak=*/{1200, 1000}))
        << "period " << p;
  }
  // With 5/4 of the set for fragmentation, no more.
  EXPECT_FALSE(Period(policy, {1450, 100}, /*peak=*/{1450, 1000}));
  EXPECT_TRUE(Period(policy, {1451, 100}));
}

// A one-off burst (a large message) is kept while it is in the window,
// then what it left goes back.
TEST(TrimPolicyTest, GivesABurstsLeftoverBackOnceItLeftTheWindow) {
  TrimPolicy policy;
  for (int p = 0; p < 2 * kWindow; ++p) Period(policy, {300, 100});
  EXPECT_FALSE(Period(policy, {1200, 100}, /*peak=*/{1200, 1000}));
  for (int p = 1; p < kWindow; ++p) {
    EXPECT_FALSE(Period(policy, {1200, 100})) << "period " << p;
  }
  EXPECT_TRUE(Period(policy, {1200, 100}));
  EXPECT_FALSE(Period(policy, {300, 100})) << "trimmed";
}

// Heap a trim cannot give back is not tried again and again: once the
// burst has left the longer window, it counts as held beyond the heap.
TEST(TrimPolicyTest, StopsTryingWhatATrimCannotGiveBack) {
  TrimPolicy policy;
  for (int p = 0; p < 2 * kWindow; ++p) Period(policy, {300, 100});
  Period(policy, {1200, 100}, /*peak=*/{1200, 1000});
  for (int p = 1; p < kWindow; ++p) Period(policy, {1200, 100});
  for (int p = 0; p < kWindow; ++p) {
    EXPECT_TRUE(Period(policy, {1200, 100})) << "period " << p;
  }
  EXPECT_FALSE(Period(policy, {1200, 100}));
}

// The failure of stop 39: a flood's heap counted as the working set for
// 30 s, so the next flood started on it (the read-flood watchdog judges
// what resident memory grows) and grew past the flood test's bound. A
// flood whose connection the server closed is forgotten at once.
TEST(TrimPolicyTest, ForgetsWhatClosedConnectionsHeld) {
  TrimPolicy policy;
  for (int p = 0; p < 2 * kWindow; ++p) Period(policy, {300, 100});
  for (int p = 0; p < 3; ++p) {
    EXPECT_FALSE(Period(policy, {1200, 100}, /*peak=*/{1200, 1000}));
  }
  policy.Forget();
  // gRPC still frees the closed connection's calls: not counted either.
  EXPECT_TRUE(Period(policy, {1200, 600}));
  EXPECT_TRUE(Period(policy, {300, 100}));  // trimmed: nothing left to give
  EXPECT_FALSE(Period(policy, {300, 100}));
  EXPECT_FALSE(Period(policy, {325, 100}));
  EXPECT_TRUE(Period(policy, {326, 100}));
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

// A burst of 64 MiB in use, freed between blocks that stay live, on a
// thread of its own (so in an arena of its own, as the server's threads
// allocate), in a process whose heap otherwise stays put. Every 16th block
// stays live, the last one among them: what lies between is free, but not
// at the top of the arena, where glibc would give it back by itself.
// Returns how long after the free the resident memory took to come down
// by 3/4 of what was freed, if it did within `wait`.
std::optional<absl::Duration> BurstComesBack(
    absl::Duration period, absl::Duration wait,
    absl::FunctionRef<void(MemoryTrimmer&)> after_free) {
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  constexpr int kBlocks = 4096;
  constexpr size_t kBlockBytes = 16 << 10;
  constexpr int64_t kFreedKb = kBlocks / 16 * 15 * (kBlockBytes >> 10);
  MemoryTrimmer trimmer(period);
  absl::SleepFor(period * 2);
  const int64_t start = ResidentKb();
  std::vector<void*> kept;
  int64_t freed = 0;
  absl::Time freed_at;
  std::thread([&] {
    std::vector<void*> blocks;
    for (int i = 0; i < kBlocks; ++i) {
      blocks.push_back(std::malloc(kBlockBytes));
      std::memset(blocks.back(), 1, kBlockBytes);
    }
    absl::SleepFor(period);  // samples see it in use
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
  after_free(trimmer);
  std::optional<absl::Duration> took;
  while (absl::Now() < freed_at + wait) {
    absl::SleepFor(absl::Milliseconds(5));
    if (freed - ResidentKb() >= kFreedKb * 3 / 4) {
      took = absl::Now() - freed_at;
      break;
    }
  }
  for (void* p : kept) std::free(p);
  return took;
}

TEST(MemoryTrimmerTest, GivesABurstsLeftoverBackOnceItLeftTheWindow) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator serves malloc, not glibc's";
#endif
  constexpr absl::Duration kPeriod = absl::Milliseconds(50);
  const std::optional<absl::Duration> took =
      BurstComesBack(kPeriod, kPeriod * (kWindow + 20), [](MemoryTrimmer&) {});
  ASSERT_TRUE(took.has_value()) << "still resident";
  EXPECT_GE(*took, kPeriod * (kWindow - 2)) << "the window kept nothing";
}

// The flood's case: the server closed the connection, and what it left
// goes back at the end of the period; without the close, the trimmer
// would keep it kWindow periods.
TEST(MemoryTrimmerTest, GivesWhatAClosedConnectionLeftBackWithinAPeriod) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator serves malloc, not glibc's";
#endif
  constexpr absl::Duration kPeriod = absl::Milliseconds(200);
  const std::optional<absl::Duration> took = BurstComesBack(
      kPeriod, kPeriod * 3.5,
      [](MemoryTrimmer& trimmer) { trimmer.ConnectionClosed(); });
  EXPECT_TRUE(took.has_value()) << "still resident after 3.5 periods";
}

// A wide job's rounds: a working set allocated, used and freed again and
// again, with the trimmer looking between rounds. Giving
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
  // A round every ~160 ms: most periods end
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
