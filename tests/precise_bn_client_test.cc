// PreciseBn (client/precise_bn.h) on the aggregator binary, each rank a
// thread. Every rank pools its batches' moments of each layer (its own
// numbers of batches, a rank without any), merges them through the
// scratch job and commits: every rank's merge and the job's statistics
// afterwards must be the population mean and unbiased variance of the
// concatenated batches of the rank's group, by the float64 reference, and
// num_batches_tracked one more than before. Groups merge apart; a missing
// rank fails the others' merge with DEADLINE_EXCEEDED naming it and leaves
// the job's statistics bit for bit as they were; the scratch job of a
// precise BN that did not end is refused; a long job id gives a scratch
// job id the server takes.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "client/layer_spec.h"
#include "client/precise_bn.h"
#include "client/sync_batch_norm_options.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "kernels/testing/batch_norm_reference.h"
#include "kernels/testing/expect_close.h"
#include "syncnorm/v1/aggregator.pb.h"
#include "tests/testing/aggregator_suite.h"

namespace syncnorm::testing {
namespace {

namespace ref = ::syncnorm::reference;

// The job's layers: their channels. Layer 2 is seen by no rank.
const std::vector<int> kChannels = {3, 5, 2};
constexpr int kUnseenLayer = 2;

// One batch of `rank` for `layer`: (4 + k + rank) x C x 3 values, a pure
// function of its arguments, with a mean far from 0 so that the float64
// merge is tested at a scale.
std::vector<float> Batch(int rank, int layer, int k) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * layer + 100 * rank + k));
  std::normal_distribution<float> value(3.0f + layer - rank, 1.0f + k);
  std::vector<float> x((4 + k + rank) * kChannels[layer] * 3);
  for (float& v : x) v = value(rng);
  return x;
}

ref::Layout LayoutOf(int rank, int layer, int k) {
  return ref::Layout{{4 + k + rank, kChannels[layer], 3}};
}

// How many batches `rank` has for `layer`: uneven, and rank 1 has none of
// layer 1.
int NumBatches(int rank, int layer) {
  if (layer == kUnseenLayer || (rank == 1 && layer == 1)) return 0;
  return 1 + (rank + layer) % 3;
}

// A rank's moments of a layer pooled over its batches, as a trainer gets
// them: each batch's (here the reference's, rounded to double), folded by
// MergeMoments.
Moments Pooled(int rank, int layer) {
  Moments pooled = Moments::Zero(kChannels[layer]);
  for (int k = 0; k < NumBatches(rank, layer); ++k) {
    const ref::Stats s =
        ref::Moments(LayoutOf(rank, layer, k), Batch(rank, layer, k));
    Moments batch;
    batch.count = s.count;
    batch.mean.assign(s.mean.begin(), s.mean.end());
    batch.m2.assign(s.m2.begin(), s.m2.end());
    MergeMoments(pooled, batch);
  }
  return pooled;
}

// The reference population statistics of a layer over `ranks`' batches.
ref::Stats Population(const std::vector<int>& ranks, int layer) {
  std::vector<ref::Layout> layouts;
  std::vector<std::vector<float>> data;
  for (int r : ranks) {
    for (int k = 0; k < NumBatches(r, layer); ++k) {
      layouts.push_back(LayoutOf(r, layer, k));
      data.push_back(Batch(r, layer, k));
    }
  }
  std::vector<const std::vector<float>*> xs;
  for (const auto& d : data) xs.push_back(&d);
  return ref::Moments(kChannels[layer], layouts, xs);
}

ref::Reals UnbiasedVar(const ref::Stats& s) {
  ref::Reals var(s.m2.size());
  for (size_t c = 0; c < var.size(); ++c) var[c] = s.m2[c] / (s.count - 1);
  return var;
}

// What one rank's precise BN gave.
struct RankRun {
  std::vector<RunningStats> merged;  // by layer
  std::vector<int64_t> counts;
  absl::Status status;  // the first failure
};

class PreciseBnClientTest : public AggregatorSuite<PreciseBnClientTest> {
 public:
  static constexpr char kScratchName[] = "precise-bn-client";
  static std::vector<std::string> AggregatorFlags() {
    return {"--round_timeout_ms=20000"};
  }

 protected:
  PreciseBnClientTest() : client_(Options()) {}

  static ClientOptions Options() {
    ClientOptions o;
    o.address = aggregator().address();
    o.rpc_timeout = absl::Seconds(20);
    o.round_timeout = absl::Seconds(30);
    return o;
  }

  // A job of kChannels layers whose statistics are not the initial ones
  // (a trained job's), num_batches_tracked 7 in every group.
  void CreateJob(const std::string& job_id, int world_size,
                 const std::vector<std::vector<int>>& groups,
                 int64_t round_timeout_ms) {
    v1::CreateJobRequest job;
    job.set_job_id(job_id);
    job.set_world_size(world_size);
    job.set_round_timeout_ms(round_timeout_ms);
    for (const auto& g : groups) {
      v1::RankGroup* group = job.add_groups();
      for (int r : g) group->add_ranks(r);
    }
    for (size_t l = 0; l < kChannels.size(); ++l) {
      SyncBatchNormOptions options;
      options.num_features = kChannels[l];
      auto spec = ToLayerSpec(options, absl::StrCat("bn", l));
      ASSERT_TRUE(spec.ok()) << spec.status();
      *job.add_layers() = *spec;
    }
    ASSERT_TRUE(client_.CreateJob(job).ok());
    v1::SetRunningStatsRequest set;
    set.set_job_id(job_id);
    for (int g = 0; g < std::max<int>(1, groups.size()); ++g) {
      for (size_t l = 0; l < kChannels.size(); ++l) {
        v1::LayerStats* s = set.add_layers();
        s->set_layer(static_cast<int>(l));
        s->set_group(g);
        s->set_num_batches_tracked(7);
        for (int c = 0; c < kChannels[l]; ++c) {
          s->add_running_mean(0.25 * c + g);
          s->add_running_var(1.5 + c);
        }
      }
    }
    ASSERT_TRUE(client_.SetRunningStats(set).ok());
  }

  v1::RunningStats Stats(const std::string& job_id, int group) {
    v1::GetRunningStatsRequest request;
    request.set_job_id(job_id);
    request.set_group(group);
    auto stats = client_.GetRunningStats(request);
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats.ok() ? *stats : v1::RunningStats();
  }

  // Runs `body` for every rank on a thread of its own.
  std::vector<RankRun> OnRanks(int world_size,
                               const std::function<void(int, RankRun&)>& body) {
    std::vector<RankRun> runs(world_size);
    std::vector<std::thread> threads;
    for (int r = 0; r < world_size; ++r) {
      threads.emplace_back([&, r] { body(r, runs[r]); });
    }
    for (std::thread& t : threads) t.join();
    return runs;
  }

  // A whole precise BN of `rank`: every layer in order, then Commit (Abort
  // after a failure). `stop_before`: the layer the rank leaves before (-1:
  // none).
  void RunRank(const std::string& job_id, int rank, int stop_before,
               RankRun& run) {
    auto pbn = PreciseBn::Start(client_, job_id, rank, /*serial=*/0);
    if (!pbn.ok()) {
      run.status = pbn.status();
      return;
    }
    for (int l = 0; l < (*pbn)->num_layers(); ++l) {
      if (l == stop_before) return;
      absl::StatusOr<RunningStats> stats = (*pbn)->Merge(l, Pooled(rank, l));
      if (!stats.ok()) {
        run.status = stats.status();
        EXPECT_TRUE((*pbn)->Abort().ok());
        return;
      }
      run.merged.push_back(*stats);
      run.counts.push_back((*pbn)->population_count(l));
    }
    run.status = (*pbn)->Commit();
  }

  // Every rank's merge and the job's statistics of each group after the
  // precise BN against the reference; the unseen layer is unchanged.
  void ExpectPopulation(const std::string& job_id,
                        const std::vector<std::vector<int>>& groups,
                        const std::vector<RankRun>& runs) {
    for (size_t g = 0; g < groups.size(); ++g) {
      const v1::RunningStats after = Stats(job_id, static_cast<int>(g));
      for (int l = 0; l < static_cast<int>(kChannels.size()); ++l) {
        const v1::LayerStats& job = after.layers(l);
        const std::string at = absl::StrCat("group ", g, " layer ", l);
        if (l == kUnseenLayer) {
          EXPECT_EQ(job.num_batches_tracked(), 7) << at;
          EXPECT_EQ(job.running_mean(0), static_cast<double>(g)) << at;
          for (int r : groups[g]) EXPECT_EQ(runs[r].counts[l], 0) << at;
          continue;
        }
        const ref::Stats want = Population(groups[g], l);
        EXPECT_EQ(job.num_batches_tracked(), 8) << at;
        ref::ExpectClose(std::vector<double>(job.running_mean().begin(),
                                             job.running_mean().end()),
                         want.mean, 1e-13, at + " job mean");
        ref::ExpectClose(std::vector<double>(job.running_var().begin(),
                                             job.running_var().end()),
                         UnbiasedVar(want), 1e-13, at + " job var");
        for (int r : groups[g]) {
          const RunningStats& got = runs[r].merged[l];
          EXPECT_EQ(runs[r].counts[l], want.count) << at;
          EXPECT_EQ(got.num_batches_tracked, 8) << at;
          EXPECT_EQ(got.mean, std::vector<double>(job.running_mean().begin(),
                                                  job.running_mean().end()))
              << at << " rank " << r << ": the merge is what was committed";
          EXPECT_EQ(got.var, std::vector<double>(job.running_var().begin(),
                                                 job.running_var().end()))
              << at << " rank " << r;
        }
      }
    }
  }

  // The scratch jobs of `job_id` the server still has.
  std::vector<std::string> ScratchJobs(const std::string& job_id) {
    std::vector<std::string> out;
    auto jobs = client_.ListJobs();
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    if (!jobs.ok()) return out;
    for (const v1::JobInfo& j : *jobs) {
      if (j.job_id().rfind(job_id + ".precise-bn.", 0) == 0) {
        out.push_back(j.job_id());
      }
    }
    return out;
  }

  Client client_;
};

TEST_F(PreciseBnClientTest, ThreeRanksGetThePopulationStatistics) {
  const std::string job = "pbn-three";
  CreateJob(job, 3, {}, 20000);
  std::vector<RankRun> runs =
      OnRanks(3, [&](int r, RankRun& run) { RunRank(job, r, -1, run); });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(runs[r].status.ok()) << "rank " << r << ": " << runs[r].status;
  }
  ExpectPopulation(job, {{0, 1, 2}}, runs);
  EXPECT_TRUE(ScratchJobs(job).empty()) << absl::StrJoin(ScratchJobs(job), ",");
}

TEST_F(PreciseBnClientTest, GroupsMergeApart) {
  const std::string job = "pbn-groups";
  const std::vector<std::vector<int>> groups = {{0, 3}, {1, 2}};
  CreateJob(job, 4, groups, 20000);
  std::vector<RankRun> runs =
      OnRanks(4, [&](int r, RankRun& run) { RunRank(job, r, -1, run); });
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(runs[r].status.ok()) << "rank " << r << ": " << runs[r].status;
  }
  ExpectPopulation(job, groups, runs);
  EXPECT_TRUE(ScratchJobs(job).empty()) << absl::StrJoin(ScratchJobs(job), ",");
}

TEST_F(PreciseBnClientTest, AMissingRankChangesNothing) {
  const std::string job = "pbn-missing";
  CreateJob(job, 3, {}, 1000);
  const v1::RunningStats before = Stats(job, 0);
  std::vector<RankRun> runs = OnRanks(
      3, [&](int r, RankRun& run) { RunRank(job, r, r == 2 ? 1 : -1, run); });
  for (int r : {0, 1}) {
    const absl::Status& s = runs[r].status;
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    EXPECT_NE(s.message().find("failed at layer 1 ('bn1'"), std::string::npos)
        << s;
    EXPECT_NE(s.message().find("[2]"), std::string::npos) << s;
    EXPECT_NE(s.message().find("nothing was changed"), std::string::npos) << s;
  }
  EXPECT_EQ(Stats(job, 0).SerializeAsString(), before.SerializeAsString());
  EXPECT_TRUE(ScratchJobs(job).empty()) << absl::StrJoin(ScratchJobs(job), ",");
}

TEST_F(PreciseBnClientTest, OneValuePerChannelIsRefusedOnEveryRank) {
  const std::string job = "pbn-one-value";
  CreateJob(job, 3, {}, 20000);
  std::vector<RankRun> runs = OnRanks(3, [&](int r, RankRun& run) {
    auto pbn = PreciseBn::Start(client_, job, r, 0);
    ASSERT_TRUE(pbn.ok()) << pbn.status();
    Moments one = Moments::Zero(kChannels[0]);
    if (r == 1) {
      one.count = 1;
      one.mean.assign(kChannels[0], 2.0);
    }
    run.status = (*pbn)->Merge(0, one).status();
    EXPECT_TRUE((*pbn)->Abort().ok());
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::IsFailedPrecondition(runs[r].status)) << runs[r].status;
  }
}

TEST_F(PreciseBnClientTest, AScratchJobLeftOverIsRefused) {
  const std::string job = "pbn-left-over";
  CreateJob(job, 3, {}, 20000);
  OnRanks(3, [&](int r, RankRun& run) { RunRank(job, r, 1, run); });
  ASSERT_EQ(ScratchJobs(job).size(), 1u);
  auto again = PreciseBn::Start(client_, job, 0, 0);
  ASSERT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  EXPECT_NE(again.status().message().find("delete"), std::string::npos);
  auto next = PreciseBn::Start(client_, job, 0, 1);  // another serial starts
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE((*next)->Abort().ok());
  EXPECT_TRUE(client_.DeleteJob(PreciseBn::ScratchJobId(job, 0, 0)).ok());
}

TEST_F(PreciseBnClientTest, ScratchJobIdsFitTheServer) {
  EXPECT_EQ(PreciseBn::ScratchJobId("run7", 3, 1), "run7.precise-bn.3.g1");
  const std::string long_id(128, 'j');
  const std::string scratch = PreciseBn::ScratchJobId(long_id, 12, 4);
  EXPECT_EQ(scratch.size(), 128u);
  EXPECT_EQ(scratch, PreciseBn::ScratchJobId(long_id, 12, 4));
  EXPECT_NE(scratch,
            PreciseBn::ScratchJobId(std::string(127, 'j') + "k", 12, 4));
  CreateJob(long_id, 3, {}, 20000);
  auto pbn = PreciseBn::Start(client_, long_id, 0, 12);
  ASSERT_TRUE(pbn.ok()) << pbn.status();
  EXPECT_EQ((*pbn)->scratch_job_id(), PreciseBn::ScratchJobId(long_id, 12, 0));
  EXPECT_TRUE((*pbn)->Abort().ok());
}

}  // namespace
}  // namespace syncnorm::testing
