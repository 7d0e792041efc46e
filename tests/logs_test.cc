// The aggregator's log, end to end: the real binary with bearer tokens runs
// a job of 7 layers whose rank 3 is absent (a quorum of 3 completes every
// round) for 20 steps, forward and backward, reloads its tokens file, and
// is stopped with a round in flight. Every line of its log must be in the
// one format (ts, level, event, key=value), the 280 quorum rounds must be
// said in a few lines, shutdown must say what it drained and that it
// stopped, and no line may hold a token.
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "tests/testing/cluster.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {
namespace {

using Stub = v1::Aggregator::Stub;

constexpr char kAdminToken[] = "logs-admin-token-0123456789abcdef";
constexpr char kLateToken[] = "logs-late-token-fedcba9876543210";
constexpr int kLayers = 7;
constexpr int kSteps = 20;

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::seconds(10));
  ctx->AddMetadata("authorization", absl::StrCat("Bearer ", kAdminToken));
  return ctx;
}

v1::Contribution Contribution(int layer, int64_t step, v1::Phase phase,
                              int rank) {
  v1::Contribution c;
  c.set_job_id("seven");
  c.set_layer(layer);
  c.set_step(step);
  c.set_phase(phase);
  c.set_rank(rank);
  if (phase == v1::FORWARD) {
    c.mutable_moments()->set_count(4);
    for (int ch = 0; ch < 2; ++ch) {
      c.mutable_moments()->add_mean(rank + ch);
      c.mutable_moments()->add_m2(1.5);
    }
  } else {
    for (int ch = 0; ch < 2; ++ch) {
      c.mutable_grad_sums()->add_sum_dy(rank - ch);
      c.mutable_grad_sums()->add_sum_dy_xmu(0.25);
    }
  }
  return c;
}

// Every layer's round of one step and phase, ranks 0-2 each from a thread
// of its own; rank 3 never comes.
void RunStep(Stub& stub, int64_t step, v1::Phase phase) {
  std::vector<std::thread> threads;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int rank = 0; rank < 3; ++rank) {
      threads.emplace_back([&stub, layer, step, phase, rank] {
        v1::RoundResult r;
        const grpc::Status s = stub.ReduceOnce(
            Context().get(), Contribution(layer, step, phase, rank), &r);
        EXPECT_TRUE(s.ok()) << s.error_message();
        EXPECT_EQ(r.missing_ranks_size(), 1);
      });
    }
  }
  for (std::thread& t : threads) t.join();
}

std::vector<std::string> LogLines(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return absl::StrSplit(s.str(), '\n', absl::SkipEmpty());
}

// The value of `key` in `line`, "" when absent.
std::string Value(const std::string& line, const std::string& key) {
  const std::string prefix = " " + key + "=";
  const size_t at = line.find(prefix);
  if (at == std::string::npos) return "";
  const size_t start = at + prefix.size();
  return line.substr(start, line.find(' ', start) - start);
}

bool Word(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || c == '_')) return false;
  }
  return true;
}

// Why `line` is not `ts=<UTC ms> level=<info|warn|error> event=<word>`
// followed by ` key=value` pairs (a value plain printable ASCII without a
// space, '"', '=' or '\', or double-quoted with backslash escapes); ""
// when it is.
std::string FormatError(absl::string_view line) {
  constexpr absl::string_view kTs = "ts=0000-00-00T00:00:00.000Z";
  if (line.size() < kTs.size()) return "too short";
  for (size_t i = 0; i < kTs.size(); ++i) {
    const bool digit = kTs[i] == '0';
    if (digit ? !absl::ascii_isdigit(line[i]) : line[i] != kTs[i]) {
      return absl::StrCat("no timestamp at ", i);
    }
  }
  line.remove_prefix(kTs.size());
  if (!absl::ConsumePrefix(&line, " level=info") &&
      !absl::ConsumePrefix(&line, " level=warn") &&
      !absl::ConsumePrefix(&line, " level=error")) {
    return "no level";
  }
  bool first = true;
  while (!line.empty()) {
    if (!absl::ConsumePrefix(&line, " ")) return "no space between pairs";
    const size_t eq = line.find('=');
    if (eq == line.npos || !Word(line.substr(0, eq))) return "no key";
    if (first && line.substr(0, eq) != "event") return "no event";
    line.remove_prefix(eq + 1);
    size_t end = 0;
    if (!line.empty() && line[0] == '"') {
      for (end = 1; end < line.size() && line[end] != '"'; ++end) {
        if (line[end] < ' ' || line[end] > '~') return "raw byte in quotes";
        if (line[end] == '\\') ++end;
      }
      if (end >= line.size()) return "unterminated quote";
      ++end;
    } else {
      while (end < line.size() && line[end] > ' ' && line[end] <= '~' &&
             line[end] != '"' && line[end] != '=' && line[end] != '\\') {
        ++end;
      }
      if (end == 0) return "empty value";
    }
    if (first && !Word(line.substr(0, end))) return "event not a word";
    line.remove_prefix(end);
    first = false;
  }
  return first ? "no event" : "";
}

std::vector<std::string> WithEvent(const std::vector<std::string>& lines,
                                   const std::string& event) {
  std::vector<std::string> out;
  for (const std::string& l : lines) {
    if (absl::StrContains(l, " event=" + event + " ") ||
        absl::EndsWith(l, " event=" + event)) {
      out.push_back(l);
    }
  }
  return out;
}

TEST(LogsTest, OneFormatFewLinesForRepeatedRoundsAndAShutdownThatSaysSo) {
  const std::string dir = MakeScratchDir("logs");
  const std::string tokens = dir + "/tokens";
  {
    std::ofstream out(tokens);
    out << kAdminToken << " admin\n";
  }
  auto agg = AggregatorProcess::Start(
      dir, {"--tokens_file=" + tokens, "--shutdown_grace_ms=300"});
  ASSERT_TRUE(agg.ok()) << agg.status();
  auto stub = v1::Aggregator::NewStub(grpc::CreateChannel(
      (*agg)->address(), grpc::InsecureChannelCredentials()));
  v1::CreateJobRequest job;
  job.set_job_id("seven");
  job.set_world_size(4);
  job.set_round_timeout_ms(10000);
  job.mutable_quorum()->set_min_ranks(3);
  job.mutable_quorum()->set_grace_ms(20);
  for (int l = 0; l < kLayers; ++l) {
    v1::LayerSpec* layer = job.add_layers();
    layer->set_name(absl::StrCat("bn", l));
    layer->set_num_features(2);
  }
  v1::JobInfo info;
  ASSERT_TRUE(stub->CreateJob(Context().get(), job, &info).ok());
  for (int64_t step = 0; step < kSteps; ++step) {
    RunStep(*stub, step, v1::FORWARD);
    RunStep(*stub, step, v1::BACKWARD);
  }

  // A token added to the file: the reload is logged, the token is not.
  {
    std::ofstream out(tokens + ".new");
    out << kAdminToken << " admin\n" << kLateToken << " job:seven\n";
  }
  ASSERT_EQ(std::rename((tokens + ".new").c_str(), tokens.c_str()), 0);
  const std::string log_path = dir + "/aggregator.log";
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (WithEvent(LogLines(log_path), "tokens_reloaded").empty() &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }

  // A round left in flight at shutdown: rank 0 alone, which the quorum of
  // 3 never completes.
  std::thread stuck([&stub] {
    v1::RoundResult r;
    (void)stub->ReduceOnce(Context().get(),
                           Contribution(0, kSteps, v1::FORWARD, 0), &r);
  });
  absl::SleepFor(absl::Milliseconds(300));
  auto code = (*agg)->Stop();
  stuck.join();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);

  const std::vector<std::string> lines = LogLines(log_path);
  ASSERT_FALSE(lines.empty());
  for (const std::string& line : lines) {
    EXPECT_EQ(FormatError(line), "") << "not in the format: " << line;
    EXPECT_FALSE(absl::StrContains(line, kAdminToken)) << line;
    EXPECT_FALSE(absl::StrContains(line, kLateToken)) << line;
  }

  // 280 quorum rounds (7 layers, 2 phases, 20 steps), each without rank 3:
  // the first of an interval in full, the others counted into its summary.
  const std::vector<std::string> full = WithEvent(lines, "quorum");
  const std::vector<std::string> summaries = WithEvent(lines, "quorum_summary");
  ASSERT_FALSE(full.empty());
  EXPECT_TRUE(absl::StrContains(full[0], "level=warn event=quorum job=seven "))
      << full[0];
  EXPECT_EQ(Value(full[0], "missing"), "[3]");
  EXPECT_LE(full.size() + summaries.size(), 6u)
      << "the quorum rounds took " << full.size() + summaries.size()
      << " lines";
  int64_t counted = full.size() - summaries.size();
  for (const std::string& s : summaries) {
    int64_t rounds = 0;
    ASSERT_TRUE(absl::SimpleAtoi(Value(s, "rounds"), &rounds)) << s;
    counted += rounds;
    EXPECT_EQ(Value(s, "job"), "seven") << s;
    EXPECT_EQ(Value(s, "missing"), "[3]") << s;
  }
  EXPECT_EQ(counted, 2 * kLayers * kSteps);

  // Start, reload, shutdown, drain and stop, each said once.
  ASSERT_EQ(WithEvent(lines, "start").size(), 1u);
  const std::string start = WithEvent(lines, "start")[0];
  EXPECT_EQ(Value(start, "tls"), "off");
  EXPECT_EQ(Value(start, "auth"), "tokens");
  ASSERT_EQ(WithEvent(lines, "tokens_reloaded").size(), 1u);
  EXPECT_EQ(Value(WithEvent(lines, "tokens_reloaded")[0], "tokens"), "2");
  ASSERT_EQ(WithEvent(lines, "signal").size(), 1u);
  EXPECT_EQ(Value(WithEvent(lines, "signal")[0], "signal"), "SIGTERM");
  ASSERT_EQ(WithEvent(lines, "shutdown").size(), 1u);
  EXPECT_EQ(Value(WithEvent(lines, "shutdown")[0], "rounds_in_flight"), "1");
  ASSERT_EQ(WithEvent(lines, "drained").size(), 1u);
  const std::string drained = WithEvent(lines, "drained")[0];
  EXPECT_TRUE(absl::StrContains(drained, "level=warn")) << drained;
  EXPECT_EQ(Value(drained, "rounds_finished"), "0") << drained;
  EXPECT_EQ(Value(drained, "rounds_failed"), "1") << drained;
  EXPECT_TRUE(absl::StrContains(lines.back(), " event=stopped exit_code=0"))
      << lines.back();
}

}  // namespace
}  // namespace syncnorm::testing
