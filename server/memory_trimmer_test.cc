// MemoryTrimmer against the kernel's count of the process's resident memory
// (/proc/self/status): heap that a thread freed between blocks it still
// holds stays resident until the trimmer runs, and then goes back.
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

int64_t ResidentKb() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

TEST(MemoryTrimmerTest, GivesHeapFreedBetweenLiveBlocksBackToTheKernel) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator serves malloc, not glibc's";
#endif
  constexpr int kBlocks = 4096;
  constexpr size_t kBlockBytes = 16 << 10;  // 64 MiB in all, below mmap's
  constexpr int64_t kFreedKb = kBlocks / 16 * 15 * (kBlockBytes >> 10);
  const int64_t start = ResidentKb();
  // On a thread of its own, so in an arena of its own, as the server's
  // threads allocate. Every 16th block stays live, the last one among
  // them: what lies between is free, but not at the top of the arena,
  // where glibc would give it back by itself.
  std::vector<void*> kept;
  std::thread([&kept] {
    std::vector<void*> blocks;
    for (int i = 0; i < kBlocks; ++i) {
      blocks.push_back(std::malloc(kBlockBytes));
      std::memset(blocks.back(), 1, kBlockBytes);
    }
    for (int i = 0; i < kBlocks; ++i) {
      if (i % 16 == 15) {
        kept.push_back(blocks[i]);
      } else {
        std::free(blocks[i]);
      }
    }
  }).join();
  const int64_t freed = ResidentKb();
  EXPECT_GE(freed - start, kFreedKb * 3 / 4)
      << "glibc gave the freed heap back by itself: the test shows nothing";
  int64_t trimmed = freed;
  {
    MemoryTrimmer trimmer(absl::Milliseconds(10));
    for (const absl::Time until = absl::Now() + absl::Seconds(5);
         freed - trimmed < kFreedKb * 3 / 4 && absl::Now() < until;) {
      absl::SleepFor(absl::Milliseconds(10));
      trimmed = ResidentKb();
    }
  }
  EXPECT_GE(freed - trimmed, kFreedKb * 3 / 4)
      << "resident: " << start << " kB at the start, " << freed
      << " kB after the free, " << trimmed << " kB with the trimmer";
  for (void* p : kept) std::free(p);
}

int64_t MinorFaults() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// A wide job's rounds: a working set allocated, used and freed again and
// again, with the trimmer looking between rounds. Giving it back each time
// makes the next round fault every page in again.
TEST(MemoryTrimmerTest, LeavesTheHeapThatRoundsUseAgainAndAgain) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator serves malloc, not glibc's";
#endif
  // As server/main.cc: glibc itself keeps the top of the heap too.
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  constexpr int kBlocks = 2048;
  constexpr size_t kBlockBytes = 16 << 10;  // 32 MiB a round
  constexpr int kRounds = 12;
  constexpr int64_t kPages = kBlocks * (kBlockBytes / 4096);
  MemoryTrimmer trimmer(absl::Milliseconds(50));
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
      absl::SleepFor(absl::Milliseconds(25));
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
      // Several of the trimmer's periods between two rounds.
      absl::SleepFor(absl::Milliseconds(120));
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
