// Elastic membership on the client: MemberSince over a job's history,
// Client::UpdateMembership over several shards (the next step resolved
// once, retried while it moves), the merged membership of GetJob, and
// JoinJob / LeaveJob on SyncBatchNorm layers. The shards are fakes in this
// process that keep a membership as the contract describes it.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "client/job_membership.h"
#include "client/running_stats.h"
#include "client/sync_batch_norm.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace syncnorm {
namespace {

v1::MembershipChange Change(int64_t version, int64_t step,
                            std::vector<int> members,
                            std::vector<int> joined = {},
                            std::vector<int> left = {}) {
  v1::MembershipChange c;
  c.set_version(version);
  c.set_step(step);
  for (int r : members) c.add_members(r);
  for (int r : joined) c.add_joined(r);
  for (int r : left) c.add_left(r);
  return c;
}

v1::JobInfo JobWith(std::vector<v1::MembershipChange> history) {
  v1::JobInfo job;
  job.set_job_id("net");
  job.set_world_size(6);
  v1::Membership* m = job.mutable_membership();
  for (const auto& c : history) *m->add_history() = c;
  if (!history.empty()) {
    m->set_version(history.back().version());
    *m->mutable_members() = history.back().members();
  }
  return job;
}

TEST(MemberSinceTest, TheStepOfTheChangeThatLastMadeTheRankAMember) {
  const v1::JobInfo job = JobWith(
      {Change(0, 0, {0, 1, 2, 3}), Change(1, 7, {0, 1, 2}, {}, {3}),
       Change(2, 9, {0, 1, 2, 4}, {4}), Change(3, 12, {0, 1, 2, 3, 4}, {3})});
  EXPECT_EQ(*MemberSince(job, 0), 0);   // a member as created
  EXPECT_EQ(*MemberSince(job, 4), 9);   // joined at 9, still a member
  EXPECT_EQ(*MemberSince(job, 3), 12);  // left at 7, back at 12
  EXPECT_TRUE(IsMember(job, 3));
  EXPECT_FALSE(IsMember(job, 5));
  absl::StatusOr<int64_t> gone = MemberSince(job, 5);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(gone.status().message(), "not a member"))
      << gone.status();
  EXPECT_EQ(MemberSince(job, 6).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MemberSince(job, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Issue 32: a wide job's answer carries its sets as runs only (the rank
// lists stay empty past 65,536 ranks). A job of 65,536 ranks: every rank
// but 0 left at step 3 and ranks 1..40000 joined back at step 8.
TEST(MemberSinceTest, ReadsTheRunsOfAWideJob) {
  const auto runs = [](std::vector<int> flat) {
    google::protobuf::RepeatedField<int32_t> out;
    for (int x : flat) out.Add(x);
    return out;
  };
  v1::JobInfo job;
  job.set_job_id("wide");
  job.set_world_size(65536);
  v1::Membership* m = job.mutable_membership();
  m->set_version(2);
  *m->mutable_member_runs() = runs({0, 40000});
  v1::MembershipChange* c = m->add_history();
  *c->mutable_member_runs() = runs({0, 65535});
  c = m->add_history();
  c->set_version(1);
  c->set_step(3);
  *c->mutable_member_runs() = runs({0, 0});
  *c->mutable_left_runs() = runs({1, 65535});
  c = m->add_history();
  c->set_version(2);
  c->set_step(8);
  *c->mutable_member_runs() = runs({0, 40000});
  *c->mutable_joined_runs() = runs({1, 40000});
  EXPECT_TRUE(IsMember(job, 0));
  EXPECT_TRUE(IsMember(job, 40000));
  EXPECT_FALSE(IsMember(job, 40001));
  EXPECT_EQ(*MemberSince(job, 0), 0);
  EXPECT_EQ(*MemberSince(job, 17), 8);
  absl::StatusOr<int64_t> gone = MemberSince(job, 50000);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kFailedPrecondition);
  // The message names the members in the bounded form, whatever the width.
  EXPECT_THAT(std::string(gone.status().message()),
              ::testing::HasSubstr("(members [0-40000], version 2"));
  EXPECT_LE(gone.status().message().size(), 512u);
}

TEST(MemberSinceTest, TheOldestKeptChangeStandsForTheStepsBeforeIt) {
  // History trimmed to a change at step 40 that did not add rank 1: rank 1
  // was a member before it too. Rank 2 joined there.
  const v1::JobInfo job = JobWith({Change(5, 40, {1, 2}, {2}, {0})});
  EXPECT_EQ(*MemberSince(job, 1), 0);
  EXPECT_EQ(*MemberSince(job, 2), 40);
  // No history at all (a job as created): every member since step 0.
  v1::JobInfo created = JobWith({});
  created.mutable_membership()->add_members(3);
  EXPECT_EQ(*MemberSince(created, 3), 0);
}

// One aggregator shard as the contract describes its membership calls.
class FakeShard final : public v1::Aggregator::Service {
 public:
  explicit FakeShard(int64_t next_step) : next_step_(next_step) {
    *membership_.add_history() = Change(0, 0, {0, 1, 2});
    membership_.add_members(0);
    membership_.add_members(1);
    membership_.add_members(2);
  }

  // The next `n` updates find next_step moved on by one (a layer completed
  // its step meanwhile).
  void MoveOnBeforeNext(int n) {
    absl::MutexLock lock(&mu_);
    refusals_ = n;
  }
  void SetCommitted(int64_t step) {
    absl::MutexLock lock(&mu_);
    committed_ = step;
  }
  std::vector<v1::UpdateMembershipRequest> updates() {
    absl::MutexLock lock(&mu_);
    return updates_;
  }
  int64_t version() {
    absl::MutexLock lock(&mu_);
    return membership_.version();
  }

  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*,
                      v1::JobInfo* info) override {
    absl::MutexLock lock(&mu_);
    *info = InfoLocked();
    return grpc::Status::OK;
  }

  grpc::Status UpdateMembership(grpc::ServerContext*,
                                const v1::UpdateMembershipRequest* request,
                                v1::JobInfo* info) override {
    absl::MutexLock lock(&mu_);
    updates_.push_back(*request);
    if (refusals_ > 0) {
      --refusals_;
      ++next_step_;
    }
    const int64_t step = request->step() == 0 ? next_step_ : request->step();
    if (step < next_step_) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("step ", step, " is completed; next_step is ",
                       next_step_));
    }
    std::vector<int> members(membership_.members().begin(),
                             membership_.members().end());
    // A change already in force (the joiners are members, the others not)
    // leaves the job as it is.
    bool in_force = true;
    for (int r : request->join()) {
      in_force = in_force && std::count(members.begin(), members.end(), r);
    }
    for (const auto* gone : {&request->leave(), &request->remove()}) {
      for (int r : *gone) {
        in_force = in_force && !std::count(members.begin(), members.end(), r);
      }
    }
    if (in_force) {
      *info = InfoLocked();
      return grpc::Status::OK;
    }
    for (int r : request->join()) members.push_back(r);
    for (const auto* gone : {&request->leave(), &request->remove()}) {
      for (int r : *gone) {
        members.erase(std::remove(members.begin(), members.end(), r),
                      members.end());
      }
    }
    std::sort(members.begin(), members.end());
    v1::MembershipChange change =
        Change(membership_.version() + 1, step, members,
               {request->join().begin(), request->join().end()},
               {request->leave().begin(), request->leave().end()});
    membership_.set_version(change.version());
    *membership_.mutable_members() = change.members();
    *membership_.add_history() = change;
    *info = InfoLocked();
    return grpc::Status::OK;
  }

  grpc::Status GetRunningStats(grpc::ServerContext*,
                               const v1::GetRunningStatsRequest* request,
                               v1::RunningStats* stats) override {
    absl::MutexLock lock(&mu_);
    stats->set_job_id(request->job_id());
    stats->set_step(committed_);
    for (int layer : request->layers()) {
      v1::LayerStats* l = stats->add_layers();
      l->set_layer(layer);
      l->set_num_batches_tracked(committed_ + 1);
      for (int c = 0; c < 3; ++c) {
        l->add_running_mean(0.25 * layer - 0.5 * c);
        l->add_running_var(1.5 + layer + c);
      }
    }
    return grpc::Status::OK;
  }

 private:
  v1::JobInfo InfoLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::JobInfo info;
    info.set_job_id("net");
    info.set_world_size(4);
    info.set_committed_step(committed_);
    info.set_next_step(next_step_);
    *info.mutable_membership() = membership_;
    return info;
  }

  absl::Mutex mu_;
  int64_t next_step_ ABSL_GUARDED_BY(mu_);
  int64_t committed_ ABSL_GUARDED_BY(mu_) = -1;
  int refusals_ ABSL_GUARDED_BY(mu_) = 0;
  v1::Membership membership_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::UpdateMembershipRequest> updates_ ABSL_GUARDED_BY(mu_);
};

// Fake shards serving on loopback ports, and a client over them.
class Shards {
 public:
  explicit Shards(const std::vector<int64_t>& next_steps) {
    std::vector<std::string> addresses;
    for (int64_t next : next_steps) {
      fakes_.push_back(std::make_unique<FakeShard>(next));
      grpc::ServerBuilder builder;
      int port = 0;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                               &port);
      builder.RegisterService(fakes_.back().get());
      servers_.push_back(builder.BuildAndStart());
      addresses.push_back(absl::StrCat("127.0.0.1:", port));
    }
    ClientOptions options;
    options.address = absl::StrJoin(addresses, ",");
    options.rpc_timeout = absl::Seconds(5);
    client_ = std::make_unique<Client>(options);
  }
  ~Shards() {
    for (auto& s : servers_) s->Shutdown();
  }

  FakeShard& shard(int i) { return *fakes_[i]; }
  Client& client() { return *client_; }

 private:
  std::vector<std::unique_ptr<FakeShard>> fakes_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::unique_ptr<Client> client_;
};

v1::UpdateMembershipRequest Join(int rank, int64_t step = 0) {
  v1::UpdateMembershipRequest r;
  r.set_job_id("net");
  r.set_step(step);
  r.add_join(rank);
  return r;
}

TEST(UpdateMembershipTest, OneServerResolvesTheNextStepItself) {
  Shards shards({6});
  absl::StatusOr<v1::JobInfo> job = shards.client().UpdateMembership(Join(3));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(shards.shard(0).updates().size(), 1u);
  EXPECT_EQ(shards.shard(0).updates()[0].step(), 0);
  EXPECT_EQ(*MemberSince(*job, 3), 6);
  EXPECT_EQ(job->membership().version(), 1);
}

TEST(UpdateMembershipTest, SeveralShardsGetTheHighestNextStep) {
  Shards shards({7, 9, 8});
  absl::StatusOr<v1::JobInfo> job = shards.client().UpdateMembership(Join(3));
  ASSERT_TRUE(job.ok()) << job.status();
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(shards.shard(i).updates().size(), 1u) << "shard " << i;
    EXPECT_EQ(shards.shard(i).updates()[0].step(), 9) << "shard " << i;
  }
  EXPECT_EQ(*MemberSince(*job, 3), 9);
  EXPECT_EQ(job->next_step(), 9);
}

TEST(UpdateMembershipTest, AStepThatMovesOnMeanwhileIsAskedForAgain) {
  Shards shards({5, 5});
  // Both shards complete step 5, then step 6, while the change is sent.
  shards.shard(0).MoveOnBeforeNext(2);
  shards.shard(1).MoveOnBeforeNext(2);
  absl::StatusOr<v1::JobInfo> job = shards.client().UpdateMembership(Join(3));
  ASSERT_TRUE(job.ok()) << job.status();
  for (int i = 0; i < 2; ++i) {
    const auto updates = shards.shard(i).updates();
    ASSERT_EQ(updates.size(), 3u);
    EXPECT_EQ(updates[0].step(), 5);
    EXPECT_EQ(updates[1].step(), 6);
    EXPECT_EQ(updates[2].step(), 7);
    EXPECT_EQ(shards.shard(i).version(), 1);
  }
  EXPECT_EQ(*MemberSince(*job, 3), 7);
}

TEST(UpdateMembershipTest, AChangeInForceFromDifferentStepsIsAnError) {
  // Shard 0 takes the change at step 5; shard 1 completed step 5 meanwhile
  // and takes it at 6, while shard 0 keeps it from 5.
  Shards shards({4, 5});
  shards.shard(1).MoveOnBeforeNext(1);
  absl::StatusOr<v1::JobInfo> job = shards.client().UpdateMembership(Join(3));
  ASSERT_EQ(job.status().code(), absl::StatusCode::kAborted) << job.status();
  EXPECT_TRUE(absl::StrContains(job.status().message(), "from step 5"))
      << job.status();
  EXPECT_TRUE(absl::StrContains(job.status().message(), "from step 6"))
      << job.status();
  EXPECT_TRUE(absl::StrContains(job.status().message(), "name the step"))
      << job.status();
}

TEST(UpdateMembershipTest, RetriesAreBounded) {
  Shards shards({4, 5});
  shards.shard(1).MoveOnBeforeNext(1000);
  absl::StatusOr<v1::JobInfo> job = shards.client().UpdateMembership(Join(3));
  ASSERT_EQ(job.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(job.status().message(), "shard 1"))
      << job.status();
  EXPECT_TRUE(absl::StrContains(job.status().message(), "next_step"))
      << job.status();
  EXPECT_EQ(shards.shard(1).updates().size(), 5u);
}

TEST(UpdateMembershipTest, AnExplicitStepIsSentAsItIsAndNotRetried) {
  Shards shards({4, 5});
  absl::StatusOr<v1::JobInfo> job =
      shards.client().UpdateMembership(Join(3, 4));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shards.shard(1).updates().size(), 1u);
  job = shards.client().UpdateMembership(Join(3, 11));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(shards.shard(0).updates().back().step(), 11);
  EXPECT_EQ(shards.shard(1).updates().back().step(), 11);
}

TEST(UpdateMembershipTest, GetJobMergesTheNewestMembershipAndHighestNextStep) {
  Shards shards({3, 8});
  // A change that reached shard 0 only (say, its other half failed).
  ASSERT_TRUE(shards.client().UpdateMembership(Join(3, 10)).ok());
  v1::UpdateMembershipRequest leave;
  leave.set_job_id("net");
  leave.set_step(12);
  leave.add_leave(0);
  ClientOptions one;
  one.address = shards.client().shards()[0];
  ASSERT_TRUE(Client(one).UpdateMembership(leave).ok());
  ASSERT_EQ(shards.shard(0).version(), 2);
  ASSERT_EQ(shards.shard(1).version(), 1);
  absl::StatusOr<v1::JobInfo> job = shards.client().GetJob("net");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->membership().version(), 2);
  EXPECT_EQ(std::vector<int>(job->membership().members().begin(),
                             job->membership().members().end()),
            (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(job->next_step(), 8);
}

// SyncBatchNorm layers of 3 channels, with indices 0..n-1.
std::vector<std::unique_ptr<SyncBatchNorm>> Layers(int n) {
  std::vector<std::unique_ptr<SyncBatchNorm>> out;
  SyncBatchNormOptions options;
  options.num_features = 3;
  for (int i = 0; i < n; ++i) {
    out.push_back(std::make_unique<SyncBatchNorm>(
        i, options, nullptr, static_cast<ThreadPool*>(nullptr)));
  }
  return out;
}

std::vector<SyncBatchNorm*> Raw(
    const std::vector<std::unique_ptr<SyncBatchNorm>>& layers) {
  std::vector<SyncBatchNorm*> out;
  for (const auto& l : layers) out.push_back(l.get());
  return out;
}

TEST(JoinJobTest, JoinsLoadsTheStatisticsAndStartsAtTheJoinStep) {
  Shards shards({5});
  shards.shard(0).SetCommitted(4);
  auto layers = Layers(2);
  absl::StatusOr<int64_t> first =
      JoinJob(shards.client(), "net", 3, Raw(layers));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, 5);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(layers[i]->step(), 5);
    const RunningStats& s = layers[i]->running_stats();
    EXPECT_EQ(s.num_batches_tracked, 5);
    for (int c = 0; c < 3; ++c) {
      EXPECT_EQ(s.mean[c], 0.25 * i - 0.5 * c);
      EXPECT_EQ(s.var[c], 1.5 + i + c);
    }
  }
  // Again (a retry, or a restarted worker): no second change.
  first = JoinJob(shards.client(), "net", 3, Raw(layers));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, 5);
  EXPECT_EQ(shards.shard(0).updates().size(), 1u);
}

TEST(JoinJobTest, WaitsForTheStepsBeforeItsFirstAndGivesUpInTime) {
  Shards shards({5});
  shards.shard(0).SetCommitted(3);  // step 4 still running on some layer
  auto layers = Layers(1);
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> first =
      JoinJob(shards.client(), "net", 3, Raw(layers), absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ASSERT_EQ(first.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(first.status().message(), "committed step 3"))
      << first.status();
  EXPECT_EQ(layers[0]->step(), 0);
  EXPECT_EQ(layers[0]->running_stats().num_batches_tracked, 0);
}

TEST(JoinJobTest, LeaveJobLeavesFromTheLayersNextStep) {
  Shards shards({2});
  auto layers = Layers(2);
  layers[0]->set_step(9);
  layers[1]->set_step(9);
  absl::StatusOr<v1::JobInfo> job =
      LeaveJob(shards.client(), "net", 1, Raw(layers));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(shards.shard(0).updates().size(), 1u);
  const v1::UpdateMembershipRequest sent = shards.shard(0).updates()[0];
  EXPECT_EQ(sent.step(), 9);
  ASSERT_EQ(sent.leave_size(), 1);
  EXPECT_EQ(sent.leave(0), 1);
  EXPECT_FALSE(IsMember(*job, 1));
}

}  // namespace
}  // namespace syncnorm
