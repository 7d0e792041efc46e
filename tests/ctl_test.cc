// syncnormctl end to end: the aggregator binary, a job with some rounds,
// and the CLI binary's output and exit codes, failures included.
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/cluster.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Result {
  int code = -1;
  std::string out, err;
};

class CtlTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(MakeScratchDir("ctl"));
    auto a = LocalAggregator::Start(*dir_);
    ASSERT_TRUE(a.ok()) << a.status();
    aggregator_ = a->release();
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
        std::thread other([&] { ASSERT_TRUE(c1->ReduceForward(layer, step, m).ok()); });
        ASSERT_TRUE(c0->ReduceForward(layer, step, m).ok());
        other.join();
      }
    }
  }
  static void TearDownTestSuite() {
    delete aggregator_;
    delete dir_;
  }

  static ClientOptions Options() {
    ClientOptions o;
    o.address = aggregator_->address();
    o.rpc_timeout = absl::Seconds(10);
    return o;
  }

  // Runs syncnormctl with `args` (and --server, unless given).
  static Result Ctl(std::vector<std::string> args, bool with_server = true) {
    if (with_server) args.push_back("--server=" + aggregator_->address());
    const std::string out = *dir_ + "/out", err = *dir_ + "/err";
    const std::string cmd =
        absl::StrCat(Runfile("client/ctl/syncnormctl"), " ",
                     absl::StrJoin(args, " "), " >", out, " 2>", err);
    const int status = std::system(cmd.c_str());
    Result r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = ReadAll(out);
    r.err = ReadAll(err);
    return r;
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

  static std::string* dir_;
  static LocalAggregator* aggregator_;
};

std::string* CtlTest::dir_ = nullptr;
LocalAggregator* CtlTest::aggregator_ = nullptr;

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
  const std::string file = *dir_ + "/net.json";
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
  const std::string bad_json = *dir_ + "/bad.json";
  std::ofstream(bad_json) << "{\"features.0.bn.running_mean\": [1, 2";
  const std::string wrong_size = *dir_ + "/wrong.json";
  std::ofstream(wrong_size) << R"({"features.0.bn.running_mean": [1, 2],
                                    "features.0.bn.running_var": [1, 2]})";
  const std::string unknown_key = *dir_ + "/unknown.json";
  std::ofstream(unknown_key) << R"({"layer9.running_mean": [1, 2, 3]})";
  const std::string negative = *dir_ + "/negative.json";
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
      {{"import", "copy", *dir_ + "/missing.json"}, 5, "cannot read"},
      {{"import", "copy", bad_json}, 5, "not valid JSON"},
      {{"import", "copy", wrong_size}, 5, "list of 3 numbers"},
      {{"import", "copy", unknown_key}, 5, "matches no layer"},
      {{"import", "copy", negative}, 5, "var < 0"},
      {{"checkpoint", "net", "500", "--timeout=300ms"}, 3, "lagging"},
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

}  // namespace
}  // namespace syncnorm::testing
