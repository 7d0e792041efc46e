// An elastic job through the C++ client and the SyncBatchNorm layer, against
// the aggregator binary: ranks 0 and 1 train, rank 2 joins (JoinJob: it
// starts from the service's statistics at the step it joined), rank 0
// leaves (LeaveJob) and is then refused. Every layer's running statistics
// and the aggregator's equal the float64 reference of the concatenated
// batch of the members of each step. Over two shards, a join at "the next
// step" takes effect at the same step on both.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "client/contributor.h"
#include "client/job_membership.h"
#include "client/layer_spec.h"
#include "client/node_group.h"
#include "client/running_stats.h"
#include "client/solo_node_group.h"
#include "client/sync_batch_norm.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "kernels/testing/batch_norm_reference.h"
#include "kernels/testing/expect_close.h"
#include "tests/testing/cluster.h"

namespace syncnorm::testing {
namespace {

namespace ref = ::syncnorm::reference;

constexpr int kChannels = 3;
constexpr char kJob[] = "elastic";

// The input of `rank` at `step`, (2 + rank) x 3 x 5: a pure function of
// both, different for each.
std::vector<float> Input(int rank, int64_t step) {
  std::mt19937 rng(static_cast<uint32_t>(100 * rank + step));
  std::normal_distribution<float> value(0.5f * step - rank, 1.0f + rank);
  std::vector<float> x((2 + rank) * kChannels * 5);
  for (float& v : x) v = value(rng);
  return x;
}

ref::Layout LayoutOf(int rank) { return ref::Layout{{2 + rank, kChannels, 5}}; }

// One worker: its own Reduce stream and one layer.
struct Worker {
  Worker(Client& client, int rank, const SyncBatchNormOptions& options)
      : rank(rank),
        group(
            std::make_unique<SoloNodeGroup>(client.NewContributor(kJob, rank))),
        layer(0, options, group.get(), static_cast<ThreadPool*>(nullptr)) {}

  absl::Status Step() {
    const std::vector<float> x = Input(rank, layer.step());
    std::vector<float> y(x.size());
    const std::vector<int64_t> shape = LayoutOf(rank).shape;
    return layer.Forward({const_cast<float*>(x.data()), shape},
                         {y.data(), shape});
  }

  const int rank;
  std::unique_ptr<NodeGroup> group;
  SyncBatchNorm layer;
};

// The reference's running statistics after `step` with `members`.
void Apply(ref::Running& running, int64_t step,
           const std::vector<int>& members) {
  std::vector<std::vector<float>> xs;
  std::vector<ref::Layout> layouts;
  for (int r : members) {
    xs.push_back(Input(r, step));
    layouts.push_back(LayoutOf(r));
  }
  std::vector<const std::vector<float>*> ptrs;
  for (const auto& x : xs) ptrs.push_back(&x);
  ref::UpdateRunning(MomentumMode::kTorch, 0.1L, false,
                     ref::Moments<float>(kChannels, layouts, ptrs), running);
}

void ExpectStats(const RunningStats& got, const ref::Running& want,
                 const std::string& what) {
  EXPECT_EQ(got.num_batches_tracked, want.num_batches_tracked) << what;
  ref::ExpectClose(got.mean, want.mean, 1e-12, what + " running_mean");
  ref::ExpectClose(got.var, want.var, 1e-12, what + " running_var");
}

// One step of every worker in `workers`, at once.
void StepAll(const std::vector<Worker*>& workers) {
  std::vector<std::thread> threads;
  for (Worker* w : workers) {
    threads.emplace_back([w] {
      absl::Status s = w->Step();
      EXPECT_TRUE(s.ok()) << "rank " << w->rank << ": " << s;
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(ElasticClientTest, JoinTrainLeaveAgainstTheFloat64Reference) {
  auto agg = AggregatorProcess::Start(MakeScratchDir("elastic-client"));
  ASSERT_TRUE(agg.ok()) << agg.status();
  ClientOptions o;
  o.address = (*agg)->address();
  o.rpc_timeout = absl::Seconds(10);
  o.round_timeout = absl::Seconds(10);
  Client client(o);
  SyncBatchNormOptions options;
  options.num_features = kChannels;
  v1::CreateJobRequest job;
  job.set_job_id(kJob);
  job.set_world_size(3);
  job.add_members(0);
  job.add_members(1);
  *job.add_layers() = *ToLayerSpec(options, "bn");
  ASSERT_TRUE(client.CreateJob(job).ok());

  Worker w0(client, 0, options), w1(client, 1, options), w2(client, 2, options);
  ref::Running want{0, ref::Reals(kChannels, 0), ref::Reals(kChannels, 1)};
  for (int64_t step = 0; step < 3; ++step) {
    StepAll({&w0, &w1});
    Apply(want, step, {0, 1});
  }
  // Rank 2 joins at the next step, 3, with the statistics after step 2.
  SyncBatchNorm* joining[] = {&w2.layer};
  absl::StatusOr<int64_t> first = JoinJob(client, kJob, 2, joining);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, 3);
  EXPECT_EQ(w2.layer.step(), 3);
  ExpectStats(w2.layer.running_stats(), want, "rank 2 as it joined");
  for (int64_t step = 3; step < 5; ++step) {
    StepAll({&w0, &w1, &w2});
    Apply(want, step, {0, 1, 2});
  }
  const ref::Running after4 = want;
  // Rank 0 leaves from its next step, 5.
  SyncBatchNorm* leaving[] = {&w0.layer};
  absl::StatusOr<v1::JobInfo> left = LeaveJob(client, kJob, 0, leaving);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_FALSE(IsMember(*left, 0));
  StepAll({&w1, &w2});
  Apply(want, 5, {1, 2});
  ExpectStats(w1.layer.running_stats(), want, "rank 1 at the end");
  ExpectStats(w2.layer.running_stats(), want, "rank 2 at the end");
  // Rank 0 left with the statistics after step 4; a step of it now is
  // refused.
  ExpectStats(w0.layer.running_stats(), after4, "rank 0 as it left");
  absl::Status refused = w0.Step();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;

  v1::GetRunningStatsRequest request;
  request.set_job_id(kJob);
  absl::StatusOr<v1::RunningStats> server = client.GetRunningStats(request);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_EQ(server->layers_size(), 1);
  RunningStats got;
  got.num_batches_tracked = server->layers(0).num_batches_tracked();
  got.mean.assign(server->layers(0).running_mean().begin(),
                  server->layers(0).running_mean().end());
  got.var.assign(server->layers(0).running_var().begin(),
                 server->layers(0).running_var().end());
  ExpectStats(got, want, "the aggregator");

  absl::StatusOr<v1::JobInfo> info = client.GetJob(kJob);
  ASSERT_TRUE(info.ok()) << info.status();
  const v1::Membership& m = info->membership();
  ASSERT_EQ(m.history_size(), 3) << m.DebugString();
  const std::vector<std::pair<int64_t, std::vector<int>>> plan = {
      {0, {0, 1}}, {3, {0, 1, 2}}, {5, {1, 2}}};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(m.history(i).step(), plan[i].first) << m.DebugString();
    EXPECT_EQ(std::vector<int>(m.history(i).members().begin(),
                               m.history(i).members().end()),
              plan[i].second)
        << m.DebugString();
  }
  EXPECT_EQ(info->next_step(), 6);
}

// A removed rank: the round waiting for it completes without it (its
// missing_ranks names it) and its later contributions are refused; a rank
// that leaves from a step whose round already waits for it is no longer
// waited for; a restore of a checkpoint from before brings both back as a
// new version.
TEST(ElasticClientTest,
     RanksThatAreGoneAreNotWaitedForAndARestoreBringsThemBack) {
  auto agg = AggregatorProcess::Start(MakeScratchDir("elastic-remove"));
  ASSERT_TRUE(agg.ok()) << agg.status();
  ClientOptions o;
  o.address = (*agg)->address();
  o.rpc_timeout = absl::Seconds(10);
  o.round_timeout = absl::Seconds(10);
  Client client(o);
  v1::CreateJobRequest job;
  job.set_job_id("remove");
  job.set_world_size(3);  // every rank a member
  SyncBatchNormOptions options;
  options.num_features = kChannels;
  *job.add_layers() = *ToLayerSpec(options, "bn");
  ASSERT_TRUE(client.CreateJob(job).ok());
  std::vector<std::unique_ptr<Contributor>> c;
  for (int r = 0; r < 3; ++r) c.push_back(client.NewContributor("remove", r));
  auto local = [](int r) {
    Moments m = Moments::Zero(kChannels);
    m.count = 2 + r;
    m.mean = {1.0 * r, 0.5, -0.5};
    m.m2 = {1.0, 2.0, 3.0};
    return m;
  };
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back(
          [&, r] { EXPECT_TRUE(c[r]->ReduceForward(0, 0, local(r)).ok()); });
    }
    for (std::thread& t : threads) t.join();
  }
  ASSERT_TRUE(client.Checkpoint("remove", 0).ok());
  // Step 1: ranks 0 and 1 wait for rank 2, which is gone; it is removed
  // from step 2, so the round of step 1 completes without it and names it
  // (from step 2 on it is no member: no round waits for it or names it).
  std::vector<absl::StatusOr<ForwardReply>> replies(
      2, absl::UnknownError("not run"));
  std::vector<std::thread> waiting;
  for (int r = 0; r < 2; ++r) {
    waiting.emplace_back(
        [&, r] { replies[r] = c[r]->ReduceForward(0, 1, local(r)); });
  }
  absl::SleepFor(absl::Milliseconds(200));
  v1::UpdateMembershipRequest remove;
  remove.set_job_id("remove");
  remove.set_step(2);
  remove.add_remove(2);
  absl::StatusOr<v1::JobInfo> removed = client.UpdateMembership(remove);
  for (std::thread& t : waiting) t.join();
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->membership().history(1).step(), 2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(replies[r].ok()) << replies[r].status();
    EXPECT_EQ(replies[r]->global.count, 2 + 3) << "rank " << r;
    EXPECT_EQ(replies[r]->missing_ranks, std::vector<int>{2}) << "rank " << r;
  }
  absl::StatusOr<ForwardReply> late = c[2]->ReduceForward(0, 2, local(2));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition)
      << late.status();
  // Rank 1 leaves from step 3 after ranks 0 and 1 began waiting at step 3:
  // that round waits for the members in force at step 3, rank 0 alone.
  absl::StatusOr<ForwardReply> alone = absl::UnknownError("not run");
  {
    std::thread both([&] { replies[1] = c[1]->ReduceForward(0, 2, local(1)); });
    ASSERT_TRUE(c[0]->ReduceForward(0, 2, local(0)).ok());
    both.join();
    ASSERT_TRUE(replies[1].ok()) << replies[1].status();
    std::thread waiting_at_3(
        [&] { alone = c[0]->ReduceForward(0, 3, local(0)); });
    absl::SleepFor(absl::Milliseconds(200));
    v1::UpdateMembershipRequest leave;
    leave.set_job_id("remove");
    leave.set_step(3);
    leave.add_leave(1);
    EXPECT_TRUE(client.UpdateMembership(leave).ok());
    waiting_at_3.join();
  }
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->global.count, 2);
  EXPECT_TRUE(alone->missing_ranks.empty());
  late = c[1]->ReduceForward(0, 3, local(1));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition)
      << late.status();
  // The checkpoint of step 0 held all three: they are back from step 1
  // (the changes of later steps are dropped).
  absl::StatusOr<v1::JobInfo> restored = client.RestoreCheckpoint("remove", 0);
  ASSERT_TRUE(restored.ok()) << restored.status();
  const v1::Membership& m = restored->membership();
  const v1::MembershipChange& latest = m.history(m.history_size() - 1);
  EXPECT_TRUE(latest.restored()) << m.DebugString();
  EXPECT_EQ(latest.step(), 1) << m.DebugString();
  EXPECT_EQ(std::vector<int>(latest.members().begin(), latest.members().end()),
            (std::vector<int>{0, 1, 2}))
      << m.DebugString();
  EXPECT_EQ(m.version(), 3) << m.DebugString();  // after the two changes
}

ClientOptions OptionsFor(const std::string& address) {
  ClientOptions o;
  o.address = address;
  o.rpc_timeout = absl::Seconds(10);
  o.round_timeout = absl::Seconds(10);
  return o;
}

// Forward rounds of `layers` at `step` from each group (rank r sends count
// 2 + r); each must count exactly `expected_count`.
void Rounds(const std::vector<NodeGroup*>& groups,
            const std::vector<int>& layers, int64_t step,
            int64_t expected_count) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < groups.size(); ++r) {
    threads.emplace_back([&, r] {
      for (int layer : layers) {
        Moments m = Moments::Zero(kChannels);
        m.count = 2 + static_cast<int64_t>(r);
        m.mean = {0.5 * r, -1.0 * step, 0.25 * layer};
        m.m2 = {1.0 + r, 2.0, 3.0};
        absl::StatusOr<ForwardReply> reply =
            groups[r]->SyncForward(layer, step, m);
        ASSERT_TRUE(reply.ok()) << "rank " << r << " layer " << layer
                                << " step " << step << ": " << reply.status();
        EXPECT_EQ(reply->global.count, expected_count)
            << "layer " << layer << " step " << step;
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

// With two shards whose layers are at different steps, a join at "the next
// step" takes effect at the same step on both: the highest next_step.
TEST(ElasticClientTest, AJoinOverShardsTakesTheHighestNextStepOnAll) {
  const std::string root = MakeScratchDir("elastic-shards");
  std::vector<std::unique_ptr<AggregatorProcess>> servers;
  std::vector<std::string> addresses;
  for (int i = 0; i < 2; ++i) {
    const std::string dir = absl::StrCat(root, "/shard-", i);
    std::filesystem::create_directories(dir);
    auto agg = AggregatorProcess::Start(dir);
    ASSERT_TRUE(agg.ok()) << agg.status();
    addresses.push_back((*agg)->address());
    servers.push_back(*std::move(agg));
  }
  Client client(OptionsFor(absl::StrJoin(addresses, ",")));
  const std::string job_id = "elastic-sharded";
  v1::CreateJobRequest job;
  job.set_job_id(job_id);
  job.set_world_size(3);
  job.add_members(0);
  job.add_members(1);
  SyncBatchNormOptions options;
  options.num_features = kChannels;
  std::vector<int> all, on_shard[2];
  for (int l = 0; l < 6; ++l) {
    *job.add_layers() = *ToLayerSpec(options, absl::StrCat("bn", l));
    all.push_back(l);
    on_shard[client.ShardOf(job_id, l)].push_back(l);
  }
  ASSERT_FALSE(on_shard[0].empty() || on_shard[1].empty())
      << "a shard holds no layer; pick another job id";
  ASSERT_TRUE(client.CreateJob(job).ok());
  std::vector<std::unique_ptr<NodeGroup>> owned;
  std::vector<NodeGroup*> members;
  for (int r = 0; r < 3; ++r) owned.push_back(client.NewNodeGroup(job_id, r));
  members = {owned[0].get(), owned[1].get()};

  Rounds(members, all, 0, 2 + 3);
  Rounds(members, on_shard[0], 1, 2 + 3);  // shard 1 is still at step 1
  absl::StatusOr<v1::JobInfo> info = client.GetJob(job_id);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->next_step(), 2);
  // Each shard alone would put "the next step" at its own: 2 and 1.
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<v1::JobInfo> one =
        Client(OptionsFor(addresses[i])).GetJob(job_id);
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_EQ(one->next_step(), 2 - i) << "shard " << i;
  }

  v1::UpdateMembershipRequest join;
  join.set_job_id(job_id);
  join.add_join(2);
  info = client.UpdateMembership(join);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(*MemberSince(*info, 2), 2);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<v1::JobInfo> one =
        Client(OptionsFor(addresses[i])).GetJob(job_id);
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_EQ(*MemberSince(*one, 2), 2) << "shard " << i;
    EXPECT_EQ(one->membership().version(), 1) << "shard " << i;
  }
  // Shard 1's step 1 goes on without rank 2; step 2 counts it everywhere.
  Rounds(members, on_shard[1], 1, 2 + 3);
  Rounds({owned[0].get(), owned[1].get(), owned[2].get()}, all, 2, 2 + 3 + 4);
}

}  // namespace
}  // namespace syncnorm::testing
