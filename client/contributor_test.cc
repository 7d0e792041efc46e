// Contributor against a scripted in-process Reduce service, on a fake clock:
// the round timeout (also while its reader is blocked on a silent server),
// the watchdog, resends with backoff, in-band UNAVAILABLE and errors that
// are not retried; backward rounds of one step told apart by their index.
#include "client/contributor.h"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client_options.h"
#include "client/fake_client_clock.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"

namespace syncnorm {
namespace {

using ::testing::HasSubstr;

// What the scripted service does with one contribution.
struct Action {
  // kDefer: answered right after the next kAnswer on its stream.
  enum Kind { kAnswer, kHold, kDefer, kInBandError, kEndStream } kind = kAnswer;
  grpc::StatusCode code = grpc::StatusCode::OK;  // kInBandError, kEndStream
};

// Reduce streams whose answers a test scripts. An answer to a forward
// contribution carries mean = local mean + 1, var = 2 and version step + 1,
// one to a backward contribution sum_dy + 1 and sum_dy_xmu * 2, so a test
// can tell it from the contribution; each echoes the contribution's layer,
// step, phase and backward index. Held contributions are never answered.
// Thread-safe.
class ScriptedAggregator final : public v1::Aggregator::Service {
 public:
  // script(contribution, stream number from 1, times this (layer, step,
  // phase, backward index) was received before) decides.
  using Script = std::function<Action(const v1::Contribution&, int, int)>;

  void SetScript(Script script) {
    absl::MutexLock lock(&mu_);
    script_ = std::move(script);
  }

  int streams_opened() const {
    absl::MutexLock lock(&mu_);
    return streams_opened_;
  }
  int received() const {
    absl::MutexLock lock(&mu_);
    return received_;
  }
  // The backward index of each BACKWARD contribution received, in order.
  std::vector<int> backward_indices() const {
    absl::MutexLock lock(&mu_);
    return backward_indices_;
  }

  // Each waits (20 s of real time at most) until its count reaches `n`.
  bool AwaitReceived(int n) const { return AwaitAtLeast(&received_, n); }
  bool AwaitStreamsCancelled(int n) const {
    return AwaitAtLeast(&streams_cancelled_, n);
  }

  grpc::Status Reduce(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::RoundResult, v1::Contribution>* stream)
      override {
    int stream_no = 0;
    {
      absl::MutexLock lock(&mu_);
      stream_no = ++streams_opened_;
    }
    v1::Contribution c;
    std::vector<v1::Contribution> deferred;
    while (stream->Read(&c)) {
      Action action;
      {
        absl::MutexLock lock(&mu_);
        ++received_;
        if (c.phase() == v1::BACKWARD) {
          backward_indices_.push_back(c.backward_index());
        }
        int& seen = seen_[{c.layer(), c.step(), c.phase(), c.backward_index()}];
        action = script_(c, stream_no, seen++);
      }
      switch (action.kind) {
        case Action::kAnswer:
          stream->Write(Answer(c));
          for (const v1::Contribution& d : deferred) stream->Write(Answer(d));
          deferred.clear();
          break;
        case Action::kHold:
          break;
        case Action::kDefer:
          deferred.push_back(c);
          break;
        case Action::kInBandError: {
          v1::RoundResult r = Header(c);
          r.mutable_error()->set_code(action.code);
          r.mutable_error()->set_message("scripted in-band error");
          stream->Write(r);
          break;
        }
        case Action::kEndStream:
          return grpc::Status(action.code, "scripted stream end");
      }
    }
    if (context->IsCancelled()) {
      absl::MutexLock lock(&mu_);
      ++streams_cancelled_;
    }
    return grpc::Status::OK;
  }

 private:
  bool AwaitAtLeast(const int* count, int n) const {
    absl::MutexLock lock(&mu_);
    auto enough = [count, n]() { return *count >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(20));
  }
  static v1::RoundResult Header(const v1::Contribution& c) {
    v1::RoundResult r;
    r.set_job_id(c.job_id());
    r.set_layer(c.layer());
    r.set_step(c.step());
    r.set_phase(c.phase());
    r.set_backward_index(c.backward_index());
    return r;
  }
  static v1::RoundResult Answer(const v1::Contribution& c) {
    v1::RoundResult r = Header(c);
    if (c.phase() == v1::BACKWARD) {
      v1::GradSums* g = r.mutable_grad_sums();
      for (double v : c.grad_sums().sum_dy()) g->add_sum_dy(v + 1);
      for (double v : c.grad_sums().sum_dy_xmu()) g->add_sum_dy_xmu(v * 2);
      return r;
    }
    r.set_version(c.step() + 1);
    v1::GlobalMoments* g = r.mutable_moments();
    g->set_count(c.moments().count());
    for (double m : c.moments().mean()) {
      g->add_mean(m + 1);
      g->add_var(2);
    }
    return r;
  }

  mutable absl::Mutex mu_;
  Script script_ ABSL_GUARDED_BY(mu_) = [](const v1::Contribution&, int, int) {
    return Action{};
  };
  int streams_opened_ ABSL_GUARDED_BY(mu_) = 0;
  int streams_cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  int received_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int> backward_indices_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<int, int64_t, int, int>, int> seen_ ABSL_GUARDED_BY(mu_);
};

// A call run on its own thread, so that a test can advance the fake clock
// while it waits and fail (rather than hang) if it never returns.
template <typename T>
class PendingCallOf {
 public:
  explicit PendingCallOf(std::function<absl::StatusOr<T>()> call)
      : thread_([this, call = std::move(call)] {
          result_ = call();
          done_.Notify();
        }) {}
  ~PendingCallOf() { Join(); }

  bool HasReturnedWithin(absl::Duration real_time) {
    return done_.WaitForNotificationWithTimeout(real_time);
  }

  // The call's result; exits the test binary (a hang is not a result) if
  // it does not return within 20 s of real time.
  const absl::StatusOr<T>& Result() {
    if (!done_.WaitForNotificationWithTimeout(absl::Seconds(20))) {
      std::fprintf(stderr, "FAILED: the contributor's call hangs\n");
      std::_Exit(1);
    }
    Join();
    return result_;
  }

 private:
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

  absl::Notification done_;
  absl::StatusOr<T> result_ = absl::UnknownError("not returned");
  std::thread thread_;
};
using PendingCall = PendingCallOf<ForwardReply>;

Moments Local(double mean) {
  Moments m;
  m.count = 4;
  m.mean = {mean, -mean};
  m.m2 = {3, 5};
  return m;
}

GradSums Sums(double v) {
  GradSums g;
  g.sum_dy = {v, 2 * v};
  g.sum_dy_xmu = {-v, 3};
  return g;
}

class ContributorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials());
    options_.round_timeout = absl::Seconds(3);
    options_.reconnect_backoff_initial = absl::Milliseconds(20);
    options_.reconnect_backoff_max = absl::Milliseconds(100);
  }
  void TearDown() override {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }

  std::unique_ptr<Contributor> NewContributor() {
    return std::make_unique<Contributor>(channel_, "job", 0, options_, &clock_);
  }

  ScriptedAggregator service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  ClientOptions options_;
  FakeClientClock clock_;
};

TEST_F(ContributorTest, AnswersARound) {
  std::unique_ptr<Contributor> c = NewContributor();
  absl::StatusOr<ForwardReply> r = c->ReduceForward(3, 7, Local(1.5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version, 8);
  EXPECT_EQ(r->global.mean, (std::vector<double>{2.5, -0.5}));
  EXPECT_TRUE(clock_.sleeps().empty());
}

// The reported hang: the server holds the round past the client's round
// timeout. The call fails DEADLINE_EXCEEDED exactly at its round timeout on
// the fake clock, the stream is cancelled once, and the next round goes on
// a new stream.
TEST_F(ContributorTest, RoundTimeoutOnASilentServerFailsAndTheNextRoundWorks) {
  service_.SetScript([](const v1::Contribution& c, int, int) {
    return Action{c.step() == 0 ? Action::kHold : Action::kAnswer};
  });
  std::unique_ptr<Contributor> c = NewContributor();
  PendingCall call([&] { return c->ReduceForward(0, 0, Local(1)); });
  ASSERT_TRUE(service_.AwaitReceived(1));
  clock_.Advance(options_.round_timeout - absl::Milliseconds(1));
  EXPECT_FALSE(call.HasReturnedWithin(absl::Milliseconds(200)))
      << "returned before its round timeout: " << call.Result().status();
  clock_.Advance(absl::Milliseconds(1));
  const absl::StatusOr<ForwardReply>& r = call.Result();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded)
      << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("within the client's 3s round timeout"));
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("job's round_timeout_ms"));
  EXPECT_THAT(std::string(r.status().message()),
              ::testing::Not(HasSubstr("CANCELLED")));

  absl::StatusOr<ForwardReply> next = c->ReduceForward(0, 1, Local(2));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->version, 2);
  EXPECT_EQ(next->global.mean, (std::vector<double>{3, -1}));
  EXPECT_EQ(service_.streams_opened(), 2);
  EXPECT_TRUE(service_.AwaitStreamsCancelled(1));
}

// Two rounds share the stream; the first one's reader runs out of time.
// The watchdog cancels the stream for it, and the other round, still in
// time, resends on a new stream and gets its result.
TEST_F(ContributorTest, WatchdogCancelsForTheOverdueReaderAndOthersResend) {
  service_.SetScript([](const v1::Contribution&, int stream, int) {
    return Action{stream == 1 ? Action::kHold : Action::kAnswer};
  });
  std::unique_ptr<Contributor> c = NewContributor();
  PendingCall first([&] { return c->ReduceForward(0, 0, Local(1)); });
  ASSERT_TRUE(service_.AwaitReceived(1));
  // The first caller is the stream's reader by now (it went straight from
  // its write to the read).
  absl::SleepFor(absl::Milliseconds(100));
  clock_.Advance(absl::Seconds(1));
  PendingCall second([&] { return c->ReduceForward(1, 0, Local(5)); });
  ASSERT_TRUE(service_.AwaitReceived(2));
  clock_.Advance(absl::Seconds(2));  // the first's deadline, not the second's

  EXPECT_EQ(first.Result().status().code(), absl::StatusCode::kDeadlineExceeded)
      << first.Result().status();
  const absl::StatusOr<ForwardReply>& r = second.Result();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global.mean, (std::vector<double>{6, -4}));
  EXPECT_EQ(service_.streams_opened(), 2);
  EXPECT_TRUE(service_.AwaitStreamsCancelled(1));
}

TEST_F(ContributorTest, ResendsOnANewStreamWithDoublingCappedBackoff) {
  service_.SetScript([](const v1::Contribution&, int stream, int) {
    if (stream <= 5) return Action{Action::kEndStream, grpc::UNAVAILABLE};
    return Action{Action::kAnswer};
  });
  std::unique_ptr<Contributor> c = NewContributor();
  absl::StatusOr<ForwardReply> r = c->ReduceForward(0, 4, Local(1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version, 5);
  EXPECT_EQ(service_.streams_opened(), 6);
  EXPECT_EQ(service_.received(), 6);
  EXPECT_EQ(clock_.sleeps(),
            (std::vector<absl::Duration>{
                absl::Milliseconds(20), absl::Milliseconds(40),
                absl::Milliseconds(80), absl::Milliseconds(100),
                absl::Milliseconds(100)}));
}

TEST_F(ContributorTest, GivesUpAtTheRoundTimeoutWhileTheServerStaysDown) {
  service_.SetScript([](const v1::Contribution&, int, int) {
    return Action{Action::kEndStream, grpc::UNAVAILABLE};
  });
  options_.round_timeout = absl::Milliseconds(250);
  std::unique_ptr<Contributor> c = NewContributor();
  const absl::Time start = clock_.Now();
  absl::StatusOr<ForwardReply> r = c->ReduceForward(0, 0, Local(1));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded)
      << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("last stream error: UNAVAILABLE"));
  // 20 + 40 + 80 + 100 ms, then what is left of the 250 ms.
  EXPECT_EQ(clock_.sleeps(),
            (std::vector<absl::Duration>{
                absl::Milliseconds(20), absl::Milliseconds(40),
                absl::Milliseconds(80), absl::Milliseconds(100),
                absl::Milliseconds(10)}));
  EXPECT_EQ(clock_.Now() - start, options_.round_timeout);
  EXPECT_TRUE(service_.AwaitReceived(6));
}

// A server that shuts down refuses a new round in-band with UNAVAILABLE;
// the contributor resends it after a backoff on the same stream.
TEST_F(ContributorTest, InBandUnavailableIsResentAfterABackoff) {
  service_.SetScript([](const v1::Contribution&, int, int seen) {
    if (seen == 0) return Action{Action::kInBandError, grpc::UNAVAILABLE};
    return Action{Action::kAnswer};
  });
  std::unique_ptr<Contributor> c = NewContributor();
  absl::StatusOr<ForwardReply> r = c->ReduceForward(0, 0, Local(1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(clock_.sleeps(),
            (std::vector<absl::Duration>{absl::Milliseconds(20)}));
  EXPECT_EQ(service_.streams_opened(), 1);
}

TEST_F(ContributorTest, ErrorsThatAreNotRetriedReturnAtOnce) {
  service_.SetScript([](const v1::Contribution& c, int, int) {
    if (c.layer() == 0)
      return Action{Action::kEndStream, grpc::UNAUTHENTICATED};
    return Action{Action::kInBandError, grpc::INVALID_ARGUMENT};
  });
  std::unique_ptr<Contributor> c = NewContributor();
  absl::StatusOr<ForwardReply> r = c->ReduceForward(0, 0, Local(1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated)
      << r.status();
  r = c->ReduceForward(1, 0, Local(1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
      << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("scripted in-band error"));
  EXPECT_TRUE(clock_.sleeps().empty());
  EXPECT_EQ(service_.received(), 2);
}

// autograd's retain_graph=True: backwards 0 and 1 of one (layer, step) are
// two rounds, in flight at once from two threads. The server answers 1
// before 0; each caller gets the result of its own index, and each message
// carried its index (also a reused message that had another).
TEST_F(ContributorTest, BackwardsOfOneStepAreRoundsOfTheirOwn) {
  service_.SetScript([](const v1::Contribution& c, int, int) {
    const bool defer =
        c.phase() == v1::BACKWARD && c.step() == 5 && c.backward_index() == 0;
    return Action{defer ? Action::kDefer : Action::kAnswer};
  });
  std::unique_ptr<Contributor> c = NewContributor();
  PendingCallOf<GradSums> zero(
      [&] { return c->ReduceBackward(2, 5, 0, Sums(1)); });
  ASSERT_TRUE(service_.AwaitReceived(1));
  PendingCallOf<GradSums> one(
      [&] { return c->ReduceBackward(2, 5, 1, Sums(10)); });
  const absl::StatusOr<GradSums>& r0 = zero.Result();
  const absl::StatusOr<GradSums>& r1 = one.Result();
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r0->sum_dy, (std::vector<double>{2, 3}));
  EXPECT_EQ(r0->sum_dy_xmu, (std::vector<double>{-2, 6}));
  EXPECT_EQ(r1->sum_dy, (std::vector<double>{11, 21}));
  EXPECT_EQ(r1->sum_dy_xmu, (std::vector<double>{-20, 6}));
  EXPECT_EQ(service_.backward_indices(), (std::vector<int>{0, 1}));

  // One at a time: index 1, then 0 in the message that just carried 1.
  ASSERT_TRUE(c->ReduceBackward(2, 6, 1, Sums(1)).ok());
  absl::StatusOr<GradSums> r = c->ReduceBackward(2, 7, 0, Sums(4));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sum_dy, (std::vector<double>{5, 9}));
  EXPECT_EQ(service_.backward_indices(), (std::vector<int>{0, 1, 1, 0}));
  EXPECT_EQ(c->ReduceBackward(2, 7, -1, Sums(4)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_.received(), 4);
}

}  // namespace
}  // namespace syncnorm
