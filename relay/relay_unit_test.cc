// The relay's pieces without a network: the job's layout and membership as
// GetJob describes them, the missing ranks of a ReduceOnce error, the
// timer queue, what gRPC's connection failures say of the TLS to a shard,
// the metrics' families.
#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "relay/answers.h"
#include "relay/job_view.h"
#include "relay/relay_metrics.h"
#include "relay/relay_tls.h"
#include "relay/timer_queue.h"

namespace syncnorm {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(JobViewTest, ConsecutiveGroupsPlaceRanksInBlocks) {
  v1::JobInfo info;
  info.set_world_size(24);
  info.set_group_size(12);
  absl::StatusOr<JobView> v = JobView::FromProto(info);
  ASSERT_TRUE(v.ok()) << v.status();
  std::optional<RankPlace> p = v->Place(21, 8);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->group, 1);
  EXPECT_EQ(p->position, 9);
  EXPECT_EQ(p->block, 1);
  // The last block of a group of 12 holds 4 positions.
  EXPECT_THAT(v->PositionRanks(1, 8, 8), ElementsAre(20, 21, 22, 23));
  EXPECT_FALSE(v->Place(24, 8).has_value());
  EXPECT_FALSE(v->Place(-1, 8).has_value());
}

TEST(JobViewTest, ExplicitGroupsUseTheirListsPositions) {
  v1::JobInfo info;
  info.set_world_size(4);
  for (auto ranks : {std::vector<int>{0, 2}, std::vector<int>{1, 3}}) {
    v1::RankGroup* g = info.add_groups();
    for (int r : ranks) g->add_ranks(r);
  }
  absl::StatusOr<JobView> v = JobView::FromProto(info);
  ASSERT_TRUE(v.ok()) << v.status();
  std::optional<RankPlace> p = v->Place(3, 2);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->group, 1);
  EXPECT_EQ(p->position, 1);
  EXPECT_THAT(v->PositionRanks(1, 0, 2), ElementsAre(1, 3));
}

TEST(JobViewTest, MembershipChangesApplyFromTheirStep) {
  v1::JobInfo info;
  info.set_world_size(8);
  v1::MembershipChange* first = info.mutable_membership()->add_history();
  first->set_step(0);
  for (int r : {0, 7}) first->add_member_runs(r);
  v1::MembershipChange* second = info.mutable_membership()->add_history();
  second->set_step(5);
  for (int r : {0, 2, 4, 7}) second->add_member_runs(r);  // 3 left
  absl::StatusOr<JobView> v = JobView::FromProto(info);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->IsMember(3, 4));
  EXPECT_FALSE(v->IsMember(3, 5));
  EXPECT_TRUE(v->IsMember(4, 100));
}

TEST(JobViewTest, RefusesBadRuns) {
  v1::JobInfo info;
  info.set_world_size(4);
  v1::MembershipChange* c = info.mutable_membership()->add_history();
  for (int r : {0, 9}) c->add_member_runs(r);
  EXPECT_FALSE(JobView::FromProto(info).ok());
}

TEST(MissingRanksOfTest, ReadsRankListsAndRuns) {
  EXPECT_THAT(MissingRanksOf("deadline waiting for ranks [2, 5-7]"),
              ElementsAre(2, 5, 6, 7));
  EXPECT_THAT(MissingRanksOf("round failed (missing ranks [3])"),
              ElementsAre(3));
  // Only some named: none rather than a wrong list.
  EXPECT_THAT(MissingRanksOf("waiting for ranks [0, 2, and 993 more]"),
              IsEmpty());
  EXPECT_THAT(MissingRanksOf("no ranks here"), IsEmpty());
  EXPECT_THAT(MissingRanksOf("ranks [4, 2]"), IsEmpty());
}

TEST(ErrorAnswerTest, EchoesTheKeyAndNamesTheMissingRanks) {
  v1::Contribution key;
  key.set_job_id("j");
  key.set_layer(3);
  key.set_step(9);
  key.set_phase(v1::BACKWARD);
  key.set_backward_index(1);
  RoundAnswer a = ErrorAnswer(
      key, absl::DeadlineExceededError("deadline waiting for ranks [1, 4]"));
  EXPECT_EQ(a->result.job_id(), "j");
  EXPECT_EQ(a->result.layer(), 3);
  EXPECT_EQ(a->result.step(), 9);
  EXPECT_EQ(a->result.phase(), v1::BACKWARD);
  EXPECT_EQ(a->result.backward_index(), 1);
  EXPECT_EQ(a->result.error().code(),
            static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED));
  EXPECT_THAT(a->result.error().missing_ranks(), ElementsAre(1, 4));
  const grpc::Status s = UnaryStatus(a->result);
  // The bytes a stream writes are the message.
  v1::RoundResult parsed;
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(a->bytes.Dump(&slices).ok());
  std::string wire;
  for (const grpc::Slice& slice : slices) {
    wire.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  ASSERT_TRUE(parsed.ParseFromString(wire));
  EXPECT_EQ(parsed.SerializeAsString(), a->result.SerializeAsString());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(s.error_message(), "deadline waiting for ranks [1, 4]");
}

TEST(TimerQueueTest, RunsInTimeOrderAndDropsAfterStop) {
  TimerQueue timers;
  std::vector<int> order;
  absl::Mutex mu;
  absl::Notification done;
  const absl::Time now = absl::Now();
  timers.At(now + absl::Milliseconds(60), [&] {
    absl::MutexLock l(&mu);
    order.push_back(3);
    done.Notify();
  });
  timers.At(now + absl::Milliseconds(30), [&] {
    absl::MutexLock l(&mu);
    order.push_back(2);
  });
  timers.At(now - absl::Seconds(1), [&] {
    absl::MutexLock l(&mu);
    order.push_back(1);
  });
  done.WaitForNotification();
  EXPECT_GE(absl::Now() - now, absl::Milliseconds(60));
  timers.Stop();
  std::atomic<bool> ran{false};
  timers.At(now, [&] { ran = true; });
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(ran);
  absl::MutexLock l(&mu);
  EXPECT_THAT(order, ElementsAre(1, 2, 3));
}

// The messages gRPC 1.51 gives a call whose connection failed, as
// relay_tls_test saw them.
grpc::Status Unavailable(const std::string& last_error) {
  return grpc::Status(
      grpc::StatusCode::UNAVAILABLE,
      "failed to connect to all addresses; last error: " + last_error);
}

TEST(ConnectFailureTest, ToldApartByWhatGrpcSays) {
  // The relay's handshake failed: the wrong CA, a plaintext shard.
  EXPECT_EQ(ClassifyConnectFailure(Unavailable(
                "UNKNOWN: ipv4:127.0.0.1:42125: Ssl handshake failed: "
                "SSL_ERROR_SSL: error:0A000086:SSL "
                "routines::certificate verify failed")),
            ConnectFailure::kHandshake);
  EXPECT_EQ(ClassifyConnectFailure(
                Unavailable("UNKNOWN: ipv4:127.0.0.1:34895: Ssl handshake "
                            "failed: SSL_ERROR_SSL: error:0A00010B:SSL "
                            "routines::wrong version number")),
            ConnectFailure::kHandshake);
  // The shard closed it: a TLS shard dialed in plaintext, or a proxy.
  EXPECT_EQ(ClassifyConnectFailure(Unavailable(
                "UNAVAILABLE: ipv4:127.0.0.1:42125: Socket closed")),
            ConnectFailure::kClosed);
  // A shard that is down, and a handshake cut by a broken connection.
  EXPECT_EQ(ClassifyConnectFailure(
                Unavailable("UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to "
                            "remote host: Connection refused")),
            ConnectFailure::kOther);
  EXPECT_EQ(ClassifyConnectFailure(Unavailable(
                "UNKNOWN: ipv4:10.0.0.7:50051: Ssl handshake failed: "
                "SSL_ERROR_SYSCALL")),
            ConnectFailure::kOther);
  // A call that broke on a connection that was up, and other codes.
  EXPECT_EQ(ClassifyConnectFailure(
                grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed")),
            ConnectFailure::kOther);
  EXPECT_EQ(ClassifyConnectFailure(
                grpc::Status(grpc::StatusCode::NOT_FOUND, "job 'x' not found")),
            ConnectFailure::kOther);
}

TEST(ConnectFailureTest, AProbeSeesTlsByTheShardsCertificate) {
  EXPECT_TRUE(ProbeSawTls(Unavailable(
      "UNKNOWN: ipv4:127.0.0.1:42125: Ssl handshake failed: SSL_ERROR_SSL: "
      "error:0A000086:SSL routines::certificate verify failed")));
  EXPECT_TRUE(ProbeSawTls(
      grpc::Status(grpc::StatusCode::NOT_FOUND, "job '' not found")));
  EXPECT_FALSE(ProbeSawTls(Unavailable(
      "UNKNOWN: ipv4:127.0.0.1:34895: Ssl handshake failed: SSL_ERROR_SSL: "
      "error:0A00010B:SSL routines::wrong version number")));
  EXPECT_FALSE(ProbeSawTls(
      Unavailable("UNAVAILABLE: ipv4:127.0.0.1:42125: Socket closed")));
  EXPECT_FALSE(ProbeSawTls(
      grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded")));
}

TEST(ConnectFailureTest, TheRanksAreToldTheShardAndTheFlags) {
  const grpc::Status s = UpstreamTlsMismatch(
      2, "shard-2:50051", /*relay_tls=*/false, ConnectFailure::kClosed,
      Unavailable("UNAVAILABLE: ipv4:10.0.0.9:50051: Socket closed"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  for (const char* part :
       {"shard 2 (shard-2:50051)", "--upstream_tls ", "--upstream_tls_root_ca",
        "--upstream_tls_client_cert", "Socket closed"}) {
    EXPECT_TRUE(absl::StrContains(s.error_message(), part))
        << part << ": " << s.error_message();
  }
}

TEST(RelayFamiliesTest, NameEveryReasonAndCode) {
  RelayLoad load;
  load.relay.passed_through_by[static_cast<int>(PassReason::kIncomplete)] = 3;
  load.service.answers[0] = 7;
  load.service.refusals[static_cast<int>(absl::StatusCode::kUnauthenticated)] =
      2;
  load.upstream.failures[UpstreamCounters::kGetJob][static_cast<int>(
      absl::StatusCode::kFailedPrecondition)] = 1;
  std::vector<std::string> samples;
  for (const prometheus::MetricFamily& f : RelayFamilies(load)) {
    EXPECT_TRUE(absl::StartsWith(f.name, "syncnorm_relay_")) << f.name;
    EXPECT_FALSE(f.help.empty()) << f.name;
    for (const prometheus::ClientMetric& m : f.metric) {
      std::string labels;
      for (const auto& l : m.label) {
        labels += l.name + "=" + l.value + ",";
      }
      samples.push_back(f.name + "{" + labels + "}");
    }
  }
  auto has = [&](const std::string& sample) {
    return std::find(samples.begin(), samples.end(), sample) != samples.end();
  };
  EXPECT_TRUE(has("syncnorm_relay_passed_through_total{reason=incomplete,}"));
  EXPECT_TRUE(
      has("syncnorm_relay_passed_through_total{reason=refused_by_shard,}"));
  EXPECT_TRUE(has("syncnorm_relay_answers_total{code=OK,}"));
  EXPECT_TRUE(has("syncnorm_relay_refusals_total{code=UNAUTHENTICATED,}"));
  EXPECT_TRUE(has("syncnorm_relay_refusals_total{code=RESOURCE_EXHAUSTED,}"));
  EXPECT_TRUE(
      has("syncnorm_relay_upstream_failures_total{method=GetJob,code="
          "FAILED_PRECONDITION,}"));
  EXPECT_TRUE(
      has("syncnorm_relay_connections_closed_total{reason=rapid_reset,}"));
}

}  // namespace
}  // namespace syncnorm
