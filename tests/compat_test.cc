// A data dir written by the previous release loads in this one, with every
// value as it was written (tests/compat/<release>/: the folder that
// release's aggregator wrote, and expected.json, made by
// tests/compat/write_data_dir.js with a generic gRPC client).
//
// The current aggregator starts on a copy of the folder and must serve the
// jobs, specs, shard assignment, committed steps, checkpoints, and running
// statistics bit for bit as the old server answered them, which equal an
// independent float64 replay of the contributions to 1e-12; a retry of a
// stored round (a quorum round's missing rank included) gets the stored
// answer; new rounds and a restore apply on top; the folder, now written
// by both releases, loads again; and a backup of it restores into an empty
// server unchanged.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/cluster.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The releases whose data dirs this build must read.
constexpr const char* kReleases[] = {"0.3.0"};

std::string CompatDir(const std::string& release) {
  const char* runfiles = std::getenv("TEST_SRCDIR");
  return absl::StrCat(runfiles != nullptr ? runfiles : ".",
                      "/syncnorm/tests/compat/", release);
}

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return json::parse(s.str());
}

ClientOptions Options(const std::string& address) {
  ClientOptions o;
  o.address = address;
  o.rpc_timeout = absl::Seconds(20);
  return o;
}

std::vector<double> Doubles(const json& list) {
  std::vector<double> out;
  for (const json& v : list) out.push_back(v.get<double>());
  return out;
}

template <typename Repeated>
std::vector<double> Doubles(const Repeated& r) {
  return std::vector<double>(r.begin(), r.end());
}

void ExpectClose(const std::vector<double>& got,
                 const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(std::abs(got[i] - want[i]),
              1e-12 * std::max(1.0, std::abs(want[i])))
        << what << "[" << i << "]: " << got[i] << " vs " << want[i];
  }
}

v1::RunningStats Stats(Client& client, const std::string& job, int group,
                       int64_t checkpoint = -1) {
  v1::GetRunningStatsRequest r;
  r.set_job_id(job);
  r.set_group(group);
  if (checkpoint >= 0) {
    r.set_checkpoint_step(checkpoint);
    r.set_use_checkpoint(true);
  }
  absl::StatusOr<v1::RunningStats> s = client.GetRunningStats(r);
  EXPECT_TRUE(s.ok()) << job << " group " << group << ": " << s.status();
  return s.ok() ? *s : v1::RunningStats();
}

// The service's statistics of one group against `written` (bit for bit)
// and `reference` (1e-12), both [layer entries] of expected.json.
void ExpectStats(const v1::RunningStats& got, const json& written,
                 const json& reference, const std::string& what) {
  ASSERT_EQ(static_cast<size_t>(got.layers_size()), written.size()) << what;
  for (int i = 0; i < got.layers_size(); ++i) {
    const v1::LayerStats& l = got.layers(i);
    const std::string where = absl::StrCat(what, " layer ", l.layer());
    EXPECT_EQ(l.layer(), written[i]["layer"].get<int>()) << where;
    EXPECT_EQ(l.num_batches_tracked(),
              written[i]["num_batches_tracked"].get<int64_t>())
        << where;
    EXPECT_EQ(l.num_batches_tracked(),
              reference[i]["num_batches_tracked"].get<int64_t>())
        << where;
    EXPECT_EQ(Doubles(l.running_mean()), Doubles(written[i]["running_mean"]))
        << where;
    EXPECT_EQ(Doubles(l.running_var()), Doubles(written[i]["running_var"]))
        << where;
    ExpectClose(Doubles(l.running_mean()),
                Doubles(reference[i]["running_mean"]), where + " mean");
    ExpectClose(Doubles(l.running_var()), Doubles(reference[i]["running_var"]),
                where + " var");
  }
}

// Everything expected.json says of `job`, asked of the server at `address`.
void ExpectJob(const std::string& address, const json& job) {
  Client client(Options(address));
  const std::string id = job["job_id"];
  absl::StatusOr<v1::JobInfo> info = client.GetJob(id);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->committed_step(), job["committed_step"].get<int64_t>()) << id;
  EXPECT_EQ(info->world_size(), job["world_size"].get<int>()) << id;
  EXPECT_EQ(info->group_size(), job["group_size"].get<int>()) << id;
  ASSERT_EQ(static_cast<size_t>(info->layers_size()), job["layers"].size());
  for (int l = 0; l < info->layers_size(); ++l) {
    EXPECT_EQ(info->layers(l).name(), job["layers"][l].get<std::string>());
  }
  absl::StatusOr<std::vector<v1::CheckpointInfo>> checkpoints =
      client.ListCheckpoints(id);
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  ASSERT_EQ(checkpoints->size(), job["checkpoints"].size()) << id;
  for (size_t c = 0; c < checkpoints->size(); ++c) {
    const json& want = job["checkpoints"][c];
    EXPECT_EQ((*checkpoints)[c].step(), want["step"].get<int64_t>());
    EXPECT_EQ((*checkpoints)[c].tag(), want["tag"].get<std::string>());
    EXPECT_EQ((*checkpoints)[c].created_unix_ms(),
              want["created_unix_ms"].get<int64_t>());
  }
  const json& written = job["written"];
  const json& reference = job["reference"];
  for (size_t g = 0; g < written["latest"].size(); ++g) {
    ExpectStats(Stats(client, id, static_cast<int>(g)), written["latest"][g],
                reference["latest"][g], absl::StrCat(id, " group ", g));
    for (const auto& [step, groups] : written["checkpoints"].items()) {
      ExpectStats(Stats(client, id, static_cast<int>(g), std::stoll(step)),
                  groups[g], reference["checkpoints"][step][g],
                  absl::StrCat(id, " checkpoint ", step, " group ", g));
    }
  }
}

class CompatTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CompatTest, ADataDirOfThePreviousReleaseLoadsWithEveryValue) {
  const std::string release = GetParam();
  const json expected = ReadJson(CompatDir(release) + "/expected.json");
  ASSERT_FALSE(expected["jobs"].empty());
  const std::string dir = MakeScratchDir("compat");
  // A writable copy (the runfiles are links into the checkout).
  fs::copy(CompatDir(release) + "/data", dir + "/data",
           fs::copy_options::recursive);
  const std::vector<std::string> flags = {"--backup_dir=" + dir + "/backups"};
  auto server = AggregatorProcess::Start(dir, flags);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  Client client(Options(address));
  absl::StatusOr<std::vector<v1::JobInfo>> jobs = client.ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), expected["jobs"].size());
  for (const json& job : expected["jobs"]) {
    SCOPED_TRACE(job["job_id"].get<std::string>());
    ExpectJob(address, job);
  }

  // The shard assignment of the sharded job.
  absl::StatusOr<v1::JobInfo> sharded = client.GetJob("compat-shard");
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_EQ(sharded->shard().shard(), 1);
  EXPECT_EQ(sharded->shard().num_shards(), 2);
  EXPECT_EQ(sharded->shard().owned_layers_size(), 1);

  // A retry of a stored round gets the stored answer.
  for (const json& job : expected["jobs"]) {
    for (const json& retry : job["retries"]) {
      v1::Contribution c;
      c.set_job_id(job["job_id"]);
      c.set_layer(retry["layer"]);
      c.set_step(retry["step"]);
      c.set_phase(v1::FORWARD);
      c.set_rank(retry["rank"]);
      v1::Moments* m = c.mutable_moments();
      m->set_count(std::stoll(retry["moments"]["count"].get<std::string>()));
      for (double v : Doubles(retry["moments"]["mean"])) m->add_mean(v);
      for (double v : Doubles(retry["moments"]["m2"])) m->add_m2(v);
      auto stub = v1::Aggregator::NewStub(
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(20));
      v1::RoundResult result;
      grpc::Status s = stub->ReduceOnce(&context, c, &result);
      ASSERT_TRUE(s.ok()) << s.error_message();
      const json& want = retry["result"];
      EXPECT_EQ(result.moments().count(), want["count"].get<int64_t>());
      EXPECT_EQ(Doubles(result.moments().mean()), Doubles(want["mean"]));
      EXPECT_EQ(Doubles(result.moments().var()), Doubles(want["var"]));
      EXPECT_EQ(result.version(), want["version"].get<int64_t>());
      EXPECT_EQ(std::vector<int>(result.missing_ranks().begin(),
                                 result.missing_ranks().end()),
                want["missing_ranks"].get<std::vector<int>>());
    }
  }

  // A backup of the old folder, restored into an empty server, is the same.
  // The job that holds shard 1's part of a sharded job goes through a
  // backup and restore of shard 1 (a generic client naming the ordinal);
  // one taken as shard 0 leaves it out, saying so.
  absl::StatusOr<std::vector<v1::BackupInfo>> backup =
      client.Backup("from-" + release);
  ASSERT_TRUE(backup.ok()) << backup.status();
  auto stub = v1::Aggregator::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    v1::BackupRequest request;
    request.set_name("from-" + release);
    request.set_shard(1);
    request.set_job_id("compat-shard");
    v1::BackupInfo info;
    grpc::Status s = stub->Backup(&context, request, &info);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(info.path(),
              absl::StrCat(dir, "/backups/from-", release, "/shard-1"));
  }
  const std::string fresh_dir = dir + "/fresh";
  fs::create_directories(fresh_dir);
  auto fresh = AggregatorProcess::Start(fresh_dir, flags);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  absl::StatusOr<std::vector<v1::RestoreBackupResponse>> restored =
      Client(Options((*fresh)->address())).RestoreBackup("from-" + release);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_EQ(static_cast<size_t>((*restored)[0].jobs_size()),
            expected["jobs"].size());
  for (const v1::RestoreBackupJob& j : (*restored)[0].jobs()) {
    EXPECT_EQ(j.restored(), j.job_id() != "compat-shard") << j.note();
  }
  {
    auto fresh_stub = v1::Aggregator::NewStub(grpc::CreateChannel(
        (*fresh)->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::RestoreBackupRequest request;
    request.set_name("from-" + release);
    request.set_shard(1);
    v1::RestoreBackupResponse response;
    grpc::Status s = fresh_stub->RestoreBackup(&context, request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(response.jobs_size(), 1);
    EXPECT_TRUE(response.jobs(0).restored());
  }
  for (const json& job : expected["jobs"]) {
    SCOPED_TRACE(absl::StrCat("restored ", job["job_id"].get<std::string>()));
    ExpectJob((*fresh)->address(), job);
  }

  // New rounds apply on top of the old records, a checkpoint restores, and
  // the folder, written by both releases now, loads again.
  const json& torch = expected["jobs"][0];
  ASSERT_EQ(torch["job_id"], "compat-torch");
  const int64_t next = torch["committed_step"].get<int64_t>() + 1;
  Moments m = Moments::Zero(3);
  m.count = 5;
  m.mean = {0.5, -0.25, 1.0};
  m.m2 = {2.0, 3.0, 4.0};
  auto rank1 = client.NewContributor("compat-torch", 1);
  absl::StatusOr<ForwardReply> other = absl::UnknownError("not run");
  std::thread t([&] { other = rank1->ReduceForward(0, next, m); });
  absl::StatusOr<ForwardReply> mine =
      client.NewContributor("compat-torch", 0)->ReduceForward(0, next, m);
  t.join();
  ASSERT_TRUE(mine.ok()) << mine.status();
  ASSERT_TRUE(other.ok()) << other.status();
  const int64_t before =
      torch["written"]["latest"][0][0]["num_batches_tracked"];
  EXPECT_EQ(mine->version, before + 1);
  ASSERT_TRUE(client.RestoreCheckpoint("compat-torch", 2).ok());
  ASSERT_TRUE((*server)->Stop().ok());
  server = AggregatorProcess::Start(dir, flags);
  ASSERT_TRUE(server.ok()) << server.status();
  Client again(Options((*server)->address()));
  absl::StatusOr<v1::JobInfo> rolled = again.GetJob("compat-torch");
  ASSERT_TRUE(rolled.ok()) << rolled.status();
  EXPECT_EQ(rolled->committed_step(), 2);
  ExpectStats(Stats(again, "compat-torch", 0),
              torch["written"]["checkpoints"]["2"][0],
              torch["reference"]["checkpoints"]["2"][0],
              "compat-torch restored to 2 after a restart");
}

INSTANTIATE_TEST_SUITE_P(Releases, CompatTest, ::testing::ValuesIn(kReleases));

}  // namespace
}  // namespace syncnorm::testing
