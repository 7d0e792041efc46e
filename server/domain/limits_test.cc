// The Aggregator's limits (jobs, their sizes, rounds in flight) and the
// draining of rounds at shutdown.
#include "server/domain/limits.h"

#include <climits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "server/domain/aggregator.h"
#include "server/domain/fake_clock.h"
#include "server/domain/job_spec.h"
#include "server/store/kv_state_store.h"
#include "server/store/memory_engine.h"

namespace syncnorm {
namespace {

JobSpec Spec(const std::string& id, int world, int layers, int channels) {
  JobSpec s;
  s.job_id = id;
  s.world_size = world;
  s.round_timeout = absl::Seconds(5);
  for (int l = 0; l < layers; ++l) {
    LayerConfig c;
    c.channels = channels;
    s.layers.push_back(c);
  }
  return s;
}

Contribution Forward(const std::string& job, int64_t step, int rank) {
  Contribution c;
  c.job_id = job;
  c.layer = 0;
  c.step = step;
  c.phase = Phase::kForward;
  c.rank = rank;
  Moments m = Moments::Zero(1);
  m.count = 2;
  m.m2[0] = 1;
  c.payload = std::move(m);
  return c;
}

Limits Small() {
  Limits l;
  l.max_jobs = 2;
  l.max_layers_per_job = 3;
  l.max_channels = 8;
  l.max_world_size = 4;
  l.max_pending_rounds = 2;
  l.max_channels_per_job = 48;
  return l;
}

void ExpectLimit(const absl::Status& s, const std::string& flag) {
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("--" + flag + "="), std::string::npos) << s;
}

class LimitsTest : public ::testing::Test {
 protected:
  LimitsTest() : agg_(Options(), &clock_, &store_) {}
  static AggregatorOptions Options() {
    AggregatorOptions o;
    o.limits = Small();
    return o;
  }
  // The outcome of `c`, if it was answered at once.
  std::optional<absl::Status> Send(Contribution c) {
    auto got = std::make_shared<std::optional<absl::Status>>();
    agg_.Contribute(std::move(c),
                    [got](const RoundOutcome& o) { *got = o.status; });
    return *got;
  }
  FakeClock clock_;
  KvStateStore store_{std::make_unique<MemoryEngine>()};
  Aggregator agg_;
};

TEST_F(LimitsTest, JobSizes) {
  ExpectLimit(agg_.CreateJob(Spec("w", 5, 1, 1)).status(), "max_world_size");
  ExpectLimit(agg_.CreateJob(Spec("l", 2, 4, 1)).status(),
              "max_layers_per_job");
  ExpectLimit(agg_.CreateJob(Spec("c", 2, 1, 9)).status(), "max_channels");
  EXPECT_TRUE(agg_.CreateJob(Spec("ok", 4, 3, 8)).ok());
}

TEST_F(LimitsTest, ChannelsPerJobCountEveryGroup) {
  JobSpec spec = Spec("g", 4, 3, 8);  // 24 channels
  spec.group_size = 2;                // 2 groups: 48
  ASSERT_TRUE(agg_.CreateJob(spec).ok());
  spec.job_id = "g1";
  spec.group_size = 1;  // 4 groups: 96
  absl::Status s = agg_.CreateJob(spec).status();
  ExpectLimit(s, "max_channels_per_job");
  EXPECT_NE(s.message().find("96 channels"), std::string::npos) << s;
}

TEST_F(LimitsTest, JobsButTheSameJobAgainIsFine) {
  ASSERT_TRUE(agg_.CreateJob(Spec("a", 2, 1, 1)).ok());
  ASSERT_TRUE(agg_.CreateJob(Spec("b", 2, 1, 1)).ok());
  ExpectLimit(agg_.CreateJob(Spec("c", 2, 1, 1)).status(), "max_jobs");
  EXPECT_TRUE(agg_.CreateJob(Spec("a", 2, 1, 1)).ok());  // idempotent
  ASSERT_TRUE(agg_.DeleteJob("b").ok());
  EXPECT_TRUE(agg_.CreateJob(Spec("c", 2, 1, 1)).ok());
}

TEST_F(LimitsTest, RoundsInFlight) {
  ASSERT_TRUE(agg_.CreateJob(Spec("a", 2, 1, 1)).ok());
  EXPECT_FALSE(Send(Forward("a", 1, 0)).has_value());  // waits for rank 1
  EXPECT_FALSE(Send(Forward("a", 2, 0)).has_value());
  EXPECT_EQ(agg_.rounds_in_flight(), 2);
  std::optional<absl::Status> third = Send(Forward("a", 3, 0));
  ASSERT_TRUE(third.has_value());
  ExpectLimit(*third, "max_pending_rounds");
  // Joining a round in flight is always fine; it completes the round.
  std::optional<absl::Status> done = Send(Forward("a", 2, 1));
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->ok()) << *done;
  EXPECT_LE(agg_.rounds_in_flight(), 1);  // step 1 may be superseded
  EXPECT_FALSE(Send(Forward("a", 4, 0)).has_value());
}

TEST_F(LimitsTest, DrainingRefusesNewRoundsAndFinishesThoseInFlight) {
  ASSERT_TRUE(agg_.CreateJob(Spec("a", 2, 1, 1)).ok());
  EXPECT_FALSE(Send(Forward("a", 1, 0)).has_value());
  agg_.StartDraining();
  std::optional<absl::Status> fresh = Send(Forward("a", 2, 0));
  ASSERT_TRUE(fresh.has_value());
  EXPECT_EQ(fresh->code(), absl::StatusCode::kUnavailable) << *fresh;
  EXPECT_NE(fresh->message().find("shutting down"), std::string::npos);
  EXPECT_FALSE(agg_.AwaitRoundsDone(absl::Now() + absl::Milliseconds(20)));
  std::optional<absl::Status> done = Send(Forward("a", 1, 1));
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->ok()) << *done;
  EXPECT_TRUE(agg_.AwaitRoundsDone(absl::Now()));
  EXPECT_EQ(agg_.GetJob("a")->committed_step, 1);
}

TEST(MessageSizeTest, NamesTheFlagItsValueAndTheSize) {
  EXPECT_TRUE(CheckMessageSize(100, "a request", 100).ok());
  EXPECT_TRUE(CheckMessageSize(1 << 30, "a request", 0).ok()) << "no limit";
  absl::Status s = CheckMessageSize(101, "a ReduceOnce request", 100);
  ExpectLimit(s, "max_message_bytes");
  EXPECT_NE(s.message().find("a ReduceOnce request of 101 bytes"),
            std::string::npos)
      << s;
  Limits limits;
  limits.max_message_bytes = 1000;
  EXPECT_EQ(ReceiveCeiling(limits), 2000);
  limits.max_message_bytes = int64_t{3} << 30;
  EXPECT_EQ(ReceiveCeiling(limits), INT_MAX);
  limits.max_message_bytes = 0;
  EXPECT_EQ(ReceiveCeiling(limits), -1);
}

TEST(TransportBytesTest, MustHoldOneMessageAtTheReceiveCeiling) {
  Limits limits;
  limits.max_message_bytes = 1000;
  EXPECT_TRUE(CheckTransportBytes(2000, limits).ok());
  EXPECT_TRUE(CheckTransportBytes(0, limits).ok()) << "no quota";
  absl::Status s = CheckTransportBytes(1999, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("--max_transport_bytes=1999"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("--max_message_bytes=1000"), std::string::npos)
      << s;
  limits.max_message_bytes = 0;
  EXPECT_TRUE(CheckTransportBytes(1, limits).ok()) << "no message limit";
}

}  // namespace
}  // namespace syncnorm
