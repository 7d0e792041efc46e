// syncnormctl end to end: the aggregator binary, a job with some rounds,
// and the CLI binary's output and exit codes, failures included.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/aggregator_suite.h"
#include "tests/testing/cluster.h"
#include "tests/testing/ctl_runner.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

using Result = CtlResult;

class CtlTest : public AggregatorSuite<CtlTest> {
 public:
  static constexpr char kScratchName[] = "ctl";
  static std::vector<std::string> AggregatorFlags() {
    return {"--backup_dir=" + dir() + "/backups"};
  }
  static void SetUpTestSuite() {
    AggregatorSuite::SetUpTestSuite();
    if (::testing::Test::HasFatalFailure()) return;
    Client client(Options());
    for (const char* id : {"net", "copy"}) {
      v1::CreateJobRequest r;
      r.set_job_id(id);
      r.set_world_size(2);
      for (int l = 0; l < 2; ++l) {
        v1::LayerSpec* s = r.add_layers();
        s->set_name(absl::StrCat("features.", l, ".bn"));
        s->set_num_features(3);
      }
      ASSERT_TRUE(client.CreateJob(r).ok());
    }
    // Steps 0..2 of both layers of "net", from both ranks.
    auto c0 = client.NewContributor("net", 0);
    auto c1 = client.NewContributor("net", 1);
    for (int64_t step = 0; step < 3; ++step) {
      for (int layer = 0; layer < 2; ++layer) {
        Moments m = Moments::Zero(3);
        m.count = 4;
        m.mean = {0.1 * step, -0.3 * layer, 1.0 / 3.0};
        m.m2 = {1.5, 2.0 + step, 0.7};
        std::thread other(
            [&] { ASSERT_TRUE(c1->ReduceForward(layer, step, m).ok()); });
        ASSERT_TRUE(c0->ReduceForward(layer, step, m).ok());
        other.join();
      }
    }
  }

 protected:
  static ClientOptions Options() {
    ClientOptions o;
    o.address = aggregator().address();
    o.rpc_timeout = absl::Seconds(10);
    return o;
  }

  // Runs syncnormctl with `args` (and --server, unless given).
  static Result Ctl(std::vector<std::string> args, bool with_server = true,
                    const std::vector<std::string>& env = {}) {
    if (with_server) args.push_back("--server=" + aggregator().address());
    return RunCtl(args, dir(), env);
  }

  static v1::RunningStats ServerStats(const std::string& job,
                                      int64_t checkpoint = -1) {
    v1::GetRunningStatsRequest r;
    r.set_job_id(job);
    if (checkpoint >= 0) {
      r.set_checkpoint_step(checkpoint);
      r.set_use_checkpoint(true);
    }
    auto s = Client(Options()).GetRunningStats(r);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : v1::RunningStats();
  }
};

TEST_F(CtlTest, ListsJobsLayersAndStatistics) {
  Result r = Ctl({"jobs"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "net")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "copy")) << r.out;
  r = Ctl({"layers", "net"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "features.1.bn")) << r.out;
  r = Ctl({"stats", "net", "features.1.bn"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "num_batches_tracked 3")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "RUNNING_MEAN")) << r.out;
  r = Ctl({"stats", "net", "0"});
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(CtlTest, HealthNamesAnOutlierRankAsATableAndAsJson) {
  // Rank 2 of 3 feeds inputs shifted by five standard deviations; rank 1
  // sends one contribution with a NaN, which is refused and counted.
  Client client(Options());
  v1::CreateJobRequest r;
  r.set_job_id("sick");
  r.set_world_size(3);
  v1::LayerSpec* l = r.add_layers();
  l->set_name("stem.bn");
  l->set_num_features(8);
  ASSERT_TRUE(client.CreateJob(r).ok());
  std::vector<std::unique_ptr<Contributor>> ranks;
  for (int rank = 0; rank < 3; ++rank) {
    ranks.push_back(client.NewContributor("sick", rank));
  }
  Moments nan = Moments::Zero(8);
  nan.count = 2;
  nan.mean[3] = std::nan("");
  EXPECT_EQ(ranks[1]->ReduceForward(0, 0, nan).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (int64_t step = 0; step < 5; ++step) {
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 3; ++rank) {
      threads.emplace_back([&, rank] {
        Moments m = Moments::Zero(8);
        m.count = 32;
        for (int c = 0; c < 8; ++c) {
          m.mean[c] = 0.1 * c + 0.05 * rank + 0.01 * step + (rank == 2 ? 5 : 0);
          m.m2[c] = 31.0 * (1 + 0.1 * rank);
        }
        EXPECT_TRUE(ranks[rank]->ReduceForward(0, step, m).ok());
      });
    }
    for (std::thread& t : threads) t.join();
  }
  Result table = Ctl({"health", "sick"});
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_TRUE(absl::StrContains(table.out, "job sick: 1 flag(s) in force"))
      << table.out;
  EXPECT_TRUE(absl::StrContains(table.out, "flagged  mean_shift")) << table.out;
  EXPECT_TRUE(absl::StrContains(table.out, "stem.bn")) << table.out;
  EXPECT_TRUE(absl::StrContains(
      table.out, "rank 1: 1 contribution(s) refused as non-finite"))
      << table.out;
  Result json = Ctl({"health", "sick", "-o", "json"});
  ASSERT_EQ(json.code, 0) << json.err;
  const nlohmann::json h = nlohmann::json::parse(json.out);
  ASSERT_TRUE(h.contains("flags")) << json.out;
  ASSERT_EQ(h["flags"].size(), 1u) << json.out;
  const nlohmann::json& flag = h["flags"][0];
  EXPECT_EQ(flag["kind"], "MEAN_SHIFT");
  EXPECT_EQ(flag["rank"], 2);
  EXPECT_EQ(flag["layer_name"], "stem.bn");
  EXPECT_EQ(flag["first_step"], "0");
  EXPECT_EQ(flag["last_step"], "4");
  EXPECT_GT(flag["score"].get<double>(), 5);
  EXPECT_EQ(h["nonfinite_total"], "1");
  EXPECT_EQ(h["refused"][0]["rank"], 1);
  Result unknown = Ctl({"health", "nobody"});
  EXPECT_EQ(unknown.code, 4) << unknown.err;  // NOT_FOUND
  EXPECT_TRUE(absl::StrContains(unknown.err, "not found")) << unknown.err;
  EXPECT_EQ(Ctl({"delete", "sick"}).code, 0);
}

TEST_F(CtlTest, LayersSayWhetherAJobIsStaleSynchronous) {
  v1::CreateJobRequest stale;
  stale.set_job_id("stale-ctl");
  stale.set_world_size(2);
  stale.set_staleness(2);
  v1::LayerSpec* l = stale.add_layers();
  l->set_name("bn");
  l->set_num_features(1);
  ASSERT_TRUE(Client(Options()).CreateJob(stale).ok());
  Result r = Ctl({"layers", "stale-ctl"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "stale-synchronous (staleness 2)"))
      << r.out;
  r = Ctl({"layers", "net"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, ", synchronous,")) << r.out;
  EXPECT_EQ(Ctl({"delete", "stale-ctl"}).code, 0);
}

TEST_F(CtlTest, ExportsAndImportsAStateDictBitForBit) {
  Result r = Ctl({"export", "net"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json dict = nlohmann::json::parse(r.out);
  const v1::RunningStats stats = ServerStats("net");
  for (const v1::LayerStats& l : stats.layers()) {
    const std::string p = l.name();
    ASSERT_TRUE(dict.contains(p + ".running_mean")) << r.out;
    EXPECT_EQ(dict[p + ".num_batches_tracked"].get<int64_t>(),
              l.num_batches_tracked());
    for (int c = 0; c < 3; ++c) {
      EXPECT_EQ(dict[p + ".running_mean"][c].get<double>(), l.running_mean(c));
      EXPECT_EQ(dict[p + ".running_var"][c].get<double>(), l.running_var(c));
    }
  }
  const std::string file = dir() + "/net.json";
  ASSERT_EQ(Ctl({"export", "net", "--out=" + file}).code, 0);
  r = Ctl({"import", "copy", file});
  ASSERT_EQ(r.code, 0) << r.err;
  const v1::RunningStats copied = ServerStats("copy");
  ASSERT_EQ(copied.layers_size(), 2);
  for (int l = 0; l < 2; ++l) {
    v1::LayerStats a = copied.layers(l), b = stats.layers(l);
    EXPECT_EQ(a.SerializeAsString(), b.SerializeAsString()) << l;
  }
}

TEST_F(CtlTest, CheckpointsListRestoreAndExportOfACheckpoint) {
  Result r = Ctl({"checkpoint", "net", "1", "--tag=warm"});
  ASSERT_EQ(r.code, 0) << r.err;
  r = Ctl({"checkpoints", "net"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "warm")) << r.out;
  r = Ctl({"export", "net", "--step=1"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json dict = nlohmann::json::parse(r.out);
  EXPECT_EQ(dict["features.0.bn.num_batches_tracked"].get<int64_t>(), 2);
  const v1::RunningStats at1 = ServerStats("net", 1);
  EXPECT_EQ(dict["features.0.bn.running_var"][1].get<double>(),
            at1.layers(0).running_var(1));
  r = Ctl({"stats", "net", "features.0.bn", "--step=1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "checkpoint of step 1")) << r.out;
  r = Ctl({"restore", "net", "1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ServerStats("net").layers(0).SerializeAsString(),
            at1.layers(0).SerializeAsString());
}

TEST_F(CtlTest, EveryFailureHasAClearMessageAndExitCode) {
  const std::string bad_json = dir() + "/bad.json";
  std::ofstream(bad_json) << "{\"features.0.bn.running_mean\": [1, 2";
  const std::string wrong_size = dir() + "/wrong.json";
  std::ofstream(wrong_size) << R"({"features.0.bn.running_mean": [1, 2],
                                    "features.0.bn.running_var": [1, 2]})";
  const std::string unknown_key = dir() + "/unknown.json";
  std::ofstream(unknown_key) << R"({"layer9.running_mean": [1, 2, 3]})";
  const std::string negative = dir() + "/negative.json";
  std::ofstream(negative) << R"({"features.0.bn.running_mean": [1, 2, 3],
                                  "features.0.bn.running_var": [1, -2, 3]})";
  struct Case {
    std::vector<std::string> args;
    int code;
    const char* says;
  };
  const Case cases[] = {
      {{}, 2, "no command"},
      {{"frobnicate"}, 2, "unknown command"},
      {{"stats", "net"}, 2, "usage: syncnormctl stats"},
      {{"jobs", "--colour=red"}, 2, "unknown option"},
      {{"stats", "net", "0", "--group=x"}, 2, "not an integer"},
      {{"layers", "nope"}, 4, "not found"},
      {{"stats", "net", "features.7.bn"}, 4, "no layer"},
      {{"export", "net", "--step=99"}, 4, "no checkpoint at step 99"},
      {{"restore", "net", "42"}, 4, "no checkpoint"},
      {{"stats", "net", "0", "--group=3"}, 5, "group 3 is out of range"},
      {{"import", "copy", dir() + "/missing.json"}, 5, "cannot read"},
      {{"import", "copy", bad_json}, 5, "not valid JSON"},
      {{"import", "copy", wrong_size}, 5, "list of 3 numbers"},
      {{"import", "copy", unknown_key}, 5, "matches no layer"},
      {{"import", "copy", negative}, 5, "var < 0"},
  };
  for (const Case& c : cases) {
    Result r = Ctl(c.args);
    EXPECT_EQ(r.code, c.code) << absl::StrJoin(c.args, " ") << "\n" << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, c.says))
        << absl::StrJoin(c.args, " ") << ": " << r.err;
  }
  Result r = Ctl({"jobs", "--server=127.0.0.1:1", "--timeout=300ms"}, false);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "is the aggregator running")) << r.err;
  r = Ctl({"--help"}, false);
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "Exit codes")) << r.out;
}

TEST_F(CtlTest, HelpComesFromDashHDoubleDashHelpAndHelp) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"-h"}, {"--help"}, {"help"}, {"jobs", "--help"}}) {
    Result r = Ctl(args, false);
    EXPECT_EQ(r.code, 0) << absl::StrJoin(args, " ") << ": " << r.err;
    EXPECT_TRUE(absl::StartsWith(r.out, "usage: syncnormctl")) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "restore-backup NAME")) << r.out;
    EXPECT_EQ(r.err, "");
  }
}

TEST_F(CtlTest, VersionIsTheProjectsVersion) {
  // The project's VERSION file (a data file: Runfile() finds executables).
  const char* runfiles = std::getenv("TEST_SRCDIR");
  ASSERT_NE(runfiles, nullptr);
  std::string version = ReadAll(absl::StrCat(runfiles, "/syncnorm/VERSION"));
  version.erase(version.find_last_not_of(" \n") + 1);
  ASSERT_FALSE(version.empty());
  Result r = Ctl({"--version"}, false);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "syncnormctl " + version + "\n");
}

TEST_F(CtlTest, OptionsTakeTheirValueAfterASpaceOrAnEqualsSign) {
  Result r = Ctl(
      {"jobs", "--server", aggregator().address(), "--timeout", "5s"}, false);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "net")) << r.out;
  r = Ctl({"stats", "net", "features.1.bn", "--group", "0"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "group 0")) << r.out;
  // A job of its own, with step 0 done, to checkpoint.
  Client client(Options());
  v1::CreateJobRequest spaced;
  spaced.set_job_id("spaced");
  spaced.set_world_size(1);
  spaced.add_layers()->set_num_features(2);
  ASSERT_TRUE(client.CreateJob(spaced).ok());
  Moments m = Moments::Zero(2);
  m.count = 4;
  m.m2 = {1.0, 2.0};
  ASSERT_TRUE(client.NewContributor("spaced", 0)->ReduceForward(0, 0, m).ok());
  r = Ctl({"checkpoint", "--tag", "first", "spaced", "0"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "tagged first")) << r.out;
  r = Ctl({"checkpoints", "spaced", "--output", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["checkpoints"][0]["tag"], "first")
      << r.out;
  ASSERT_EQ(Ctl({"delete", "spaced"}).code, 0);
  r = Ctl({"checkpoint", "net", "0", "--tag"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "--tag needs a value")) << r.err;
}

TEST_F(CtlTest, EveryListingPrintsJsonWithDashOJson) {
  Client client(Options());
  auto job = client.GetJob("net");
  ASSERT_TRUE(job.ok());
  Result r = Ctl({"jobs", "-o", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  bool found = false;
  for (const auto& info : j["jobs"]) {
    if (info["job_id"] != "net") continue;
    found = true;
    EXPECT_EQ(info["world_size"], 2);
    EXPECT_EQ(info["layers"].size(), 2u);
    EXPECT_EQ(info["committed_step"], absl::StrCat(job->committed_step()));
    EXPECT_TRUE(info["missing_shards"].empty());
  }
  EXPECT_TRUE(found) << r.out;

  const v1::RunningStats stats = ServerStats("net");
  r = Ctl({"layers", "net", "-o", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["job"]["job_id"], "net");
  ASSERT_EQ(j["stats"]["layers"].size(), 2u) << r.out;
  EXPECT_EQ(j["stats"]["layers"][1]["num_batches_tracked"],
            absl::StrCat(stats.layers(1).num_batches_tracked()));

  r = Ctl({"stats", "net", "features.1.bn", "-ojson"});
  ASSERT_EQ(r.code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["layers"].size(), 1u) << r.out;
  for (int c = 0; c < 3; ++c) {
    // Every digit: the same bits as the service's.
    EXPECT_EQ(j["layers"][0]["running_mean"][c].get<double>(),
              stats.layers(1).running_mean(c));
    EXPECT_EQ(j["layers"][0]["running_var"][c].get<double>(),
              stats.layers(1).running_var(c));
  }

  auto listed = client.ListCheckpoints("net");
  ASSERT_TRUE(listed.ok());
  r = Ctl({"checkpoints", "net", "-o=json"});
  ASSERT_EQ(r.code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["checkpoints"].size(), listed->size()) << r.out;
  for (size_t i = 0; i < listed->size(); ++i) {
    EXPECT_EQ(j["checkpoints"][i]["step"], absl::StrCat((*listed)[i].step()));
  }

  ASSERT_EQ(Ctl({"backup", "for-json"}).code, 0);
  r = Ctl({"backups", "-o", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  found = false;
  for (const auto& b : j["backups"]) {
    if (b["name"] != "for-json") continue;
    found = true;
    EXPECT_EQ(b["jobs"].size(), 2u) << r.out;
    EXPECT_TRUE(b["missing_shards"].empty());
  }
  EXPECT_TRUE(found) << r.out;

  r = Ctl({"jobs", "-o", "yaml"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.err, "table (the default) or json")) << r.err;
}

TEST_F(CtlTest, TheServerComesFromSyncnormAddressWithoutAFlag) {
  Result r =
      Ctl({"jobs"}, false, {"SYNCNORM_ADDRESS=" + aggregator().address()});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "net")) << r.out;
  // The flag wins over the variable.
  r = Ctl({"jobs"}, true, {"SYNCNORM_ADDRESS=127.0.0.1:1"});
  EXPECT_EQ(r.code, 0) << r.err;
  // An unreachable address names where it came from.
  r = Ctl({"jobs", "--timeout=300ms"}, false, {"SYNCNORM_ADDRESS=127.0.0.1:1"});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "127.0.0.1:1 (from SYNCNORM_ADDRESS)"))
      << r.err;
}

TEST_F(CtlTest, ACheckpointAheadOfTheJobSaysWhichStepItWaitsFor) {
  auto job = Client(Options()).GetJob("net");
  ASSERT_TRUE(job.ok());
  Result r = Ctl({"checkpoint", "net", "500", "--timeout=300ms"});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(absl::StrContains(
      r.err, absl::StrCat("still waiting for step 500 (committed ",
                          job->committed_step(), ")")))
      << r.err;
  EXPECT_FALSE(absl::StrContains(r.err, "is the aggregator running")) << r.err;
}

TEST_F(CtlTest, BackupsAreWrittenListedAndRestored) {
  Result r = Ctl({"backup", "ctl-backup"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "shard 0: ")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "ctl-backup/shard-0")) << r.out;
  r = Ctl({"backup", "ctl-backup"});
  EXPECT_EQ(r.code, 5) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "exists")) << r.err;
  // Without a name: the UTC time; --job limits it to one job.
  r = Ctl({"backup", "--job", "copy"});
  ASSERT_EQ(r.code, 0) << r.err;
  r = Ctl({"backups"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "ctl-backup")) << r.out;
  EXPECT_TRUE(absl::StrContains(
      r.out, absl::FormatTime("%Y%m%d-", absl::Now(), absl::UTCTimeZone())))
      << r.out;

  // A deleted job comes back with its statistics, bit for bit; one the
  // server holds is kept unless --replace.
  const v1::RunningStats copy = ServerStats("copy");
  ASSERT_EQ(Ctl({"delete", "copy"}).code, 0);
  r = Ctl({"restore-backup", "ctl-backup", "copy"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "shard 0: copy restored")) << r.out;
  const v1::RunningStats back = ServerStats("copy");
  ASSERT_EQ(back.layers_size(), copy.layers_size());
  for (int l = 0; l < copy.layers_size(); ++l) {
    EXPECT_EQ(back.layers(l).SerializeAsString(),
              copy.layers(l).SerializeAsString());
  }
  r = Ctl({"restore-backup", "ctl-backup", "net"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "shard 0: net kept")) << r.out;
  r = Ctl({"restore-backup", "ctl-backup", "net", "--replace"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "shard 0: net restored")) << r.out;
  r = Ctl({"restore-backup", "no-such-backup"});
  EXPECT_EQ(r.code, 4) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "no backup 'no-such-backup'")) << r.err;

  // A server without --backup_dir says how to get one.
  const std::string bare_dir = dir() + "/bare";
  std::filesystem::create_directories(bare_dir);
  auto bare = AggregatorProcess::Start(bare_dir);
  ASSERT_TRUE(bare.ok()) << bare.status();
  r = Ctl({"backup", "--server", (*bare)->address()}, false);
  EXPECT_EQ(r.code, 5) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "no --backup_dir")) << r.err;
}

// An elastic job of world 4 with members 0-2 and steps 0 and 1 of one
// layer done: members, join, leave, remove, and members in the listings.
TEST_F(CtlTest, MembersAreShownAndChanged) {
  Client client(Options());
  v1::CreateJobRequest job;
  job.set_job_id("elastic");
  job.set_world_size(4);
  for (int r : {0, 1, 2}) job.add_members(r);
  v1::LayerSpec* spec = job.add_layers();
  spec->set_name("bn");
  spec->set_num_features(2);
  ASSERT_TRUE(client.CreateJob(job).ok());
  std::vector<std::unique_ptr<Contributor>> ranks;
  for (int r : {0, 1, 2}) ranks.push_back(client.NewContributor("elastic", r));
  for (int64_t step = 0; step < 2; ++step) {
    std::vector<std::thread> threads;
    for (auto& c : ranks) {
      threads.emplace_back([&c, step] {
        Moments m = Moments::Zero(2);
        m.count = 3;
        m.mean = {0.5 * c->rank(), -1.0};
        m.m2 = {2.0, 1.0 + step};
        EXPECT_TRUE(c->ReduceForward(0, step, m).ok());
      });
    }
    for (std::thread& t : threads) t.join();
  }
  ASSERT_TRUE(client.Checkpoint("elastic", 1).ok());

  Result r = Ctl({"members", "elastic"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(
      r.out, "members 0-2 of world 4 (version 0); next step 2"))
      << r.out;
  r = Ctl({"join", "elastic", "3"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(
      absl::StrContains(r.out, "from step 2 the members are 0-3 (version 1)"))
      << r.out;
  r = Ctl({"join", "elastic", "3"});  // again: already in force
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "(version 1)")) << r.out;
  r = Ctl({"leave", "elastic", "0", "--step", "5"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(
      absl::StrContains(r.out, "from step 5 the members are 1-3 (version 2)"))
      << r.out;

  r = Ctl({"members", "elastic"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "joined 3")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "left 0")) << r.out;
  r = Ctl({"members", "elastic", "-o", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["next_step"], "2") << r.out;
  EXPECT_EQ(j["membership"]["version"], "2") << r.out;
  ASSERT_EQ(j["membership"]["history"].size(), 3u) << r.out;
  EXPECT_EQ(j["membership"]["history"][1]["step"], "2") << r.out;
  EXPECT_EQ(j["membership"]["history"][1]["joined"], nlohmann::json::array({3}))
      << r.out;
  EXPECT_EQ(j["membership"]["members"], nlohmann::json::array({1, 2, 3}))
      << r.out;

  r = Ctl({"jobs"});
  ASSERT_EQ(r.code, 0) << r.err;
  bool listed = false;
  for (absl::string_view line : absl::StrSplit(r.out, '\n')) {
    if (!absl::StartsWith(line, "elastic ")) continue;
    listed = true;
    EXPECT_TRUE(absl::StrContains(line, " 1-3 ")) << line;
  }
  EXPECT_TRUE(listed) << r.out;
  r = Ctl({"checkpoints", "elastic"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "MEMBERS")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, " 0-2 ")) << r.out;

  // Refusals: a completed step (the message names the next one), a rank
  // outside the world, a bad word.
  r = Ctl({"remove", "elastic", "2", "--step=1"});
  EXPECT_EQ(r.code, 5) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "step 2")) << r.err;  // the next
  r = Ctl({"join", "elastic", "4"});
  EXPECT_EQ(r.code, 5) << r.err;
  r = Ctl({"leave", "elastic", "two"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "RANK 'two' is not a rank")) << r.err;
  r = Ctl({"members", "nope"});
  EXPECT_EQ(r.code, 4) << r.err;
}

TEST_F(CtlTest, AServerThatPredatesACallIsNamedAsOlder) {
  // A server of an older release has no Backup: gRPC answers UNIMPLEMENTED.
  v1::Aggregator::CallbackService older;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&older);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  Result r = Ctl({"backups", absl::StrCat("--server=127.0.0.1:", port)}, false);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "runs an older syncnorm")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "upgrade the aggregator")) << r.err;
  server->Shutdown();
}

}  // namespace
}  // namespace syncnorm::testing
