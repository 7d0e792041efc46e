#include "server/rpc/waiting_calls.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace syncnorm {
namespace {

TEST(WaitingCallsTest, RefusesPastTheLimitNamingTheFlag) {
  WaitingCalls calls(2);
  ASSERT_TRUE(calls.Enter("a ReduceOnce call").ok());
  ASSERT_TRUE(calls.Enter("a Checkpoint call").ok());
  const absl::Status third = calls.Enter("a Checkpoint call");
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(third.message(), "a Checkpoint call")) << third;
  EXPECT_TRUE(absl::StrContains(third.message(), "--max_waiting_calls=2"))
      << third;
  EXPECT_EQ(calls.size(), 2);
  calls.Leave();
  EXPECT_TRUE(calls.Enter("a ReduceOnce call").ok());
  EXPECT_EQ(calls.size(), 2);
}

TEST(WaitingCallsTest, ZeroIsNoLimit) {
  WaitingCalls calls(0);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(calls.Enter("a call").ok());
  EXPECT_EQ(calls.size(), 1000);
}

// Never more admitted than the limit, whatever the interleaving.
TEST(WaitingCallsTest, ConcurrentCallersNeverPassTheLimit) {
  constexpr int kLimit = 8;
  WaitingCalls calls(kLimit);
  std::vector<std::thread> threads;
  std::atomic<int> admitted{0};
  std::atomic<int> peak{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        if (!calls.Enter("a call").ok()) continue;
        const int now = admitted.fetch_add(1) + 1;
        int p = peak.load();
        while (now > p && !peak.compare_exchange_weak(p, now)) {
        }
        admitted.fetch_sub(1);
        calls.Leave();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(peak.load(), kLimit);
  EXPECT_EQ(calls.size(), 0);
}

}  // namespace
}  // namespace syncnorm
