#include "server/domain/periodic_thread.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace syncnorm {
namespace {

TEST(PeriodicThreadTest, TicksEveryPeriodUntilDestroyed) {
  std::atomic<int> ticks{0};
  absl::Notification third;
  {
    PeriodicThread thread(absl::Milliseconds(5), [&] {
      if (++ticks == 3) third.Notify();
    });
    ASSERT_TRUE(third.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  const int at_destruction = ticks.load();
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ(ticks.load(), at_destruction);
}

TEST(PeriodicThreadTest, DestructionDoesNotWaitOutAPeriod) {
  int ticks = 0;
  const absl::Time start = absl::Now();
  {
    PeriodicThread thread(absl::Hours(1), [&] { ++ticks; });
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(ticks, 0);
}

TEST(PeriodicThreadTest, DestructionWaitsForATickInProgress) {
  absl::Notification started;
  std::atomic<bool> finished{false};
  {
    PeriodicThread thread(absl::Milliseconds(1), [&] {
      if (started.HasBeenNotified()) return;
      started.Notify();
      absl::SleepFor(absl::Milliseconds(50));
      finished = true;
    });
    started.WaitForNotification();
  }
  EXPECT_TRUE(finished.load());
}

}  // namespace
}  // namespace syncnorm
