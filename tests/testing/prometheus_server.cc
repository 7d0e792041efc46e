#include "tests/testing/prometheus_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/testing/scrape.h"

namespace syncnorm::testing {
namespace {

std::string Config(const PrometheusOptions& options) {
  const std::string interval = absl::FormatDuration(options.interval);
  std::string out =
      absl::StrCat("global:\n  scrape_interval: ", interval,
                   "\n  evaluation_interval: ", interval, "\nrule_files:\n");
  for (const std::string& file : options.rule_files) {
    absl::StrAppend(&out, "  - '", file, "'\n");
  }
  absl::StrAppend(&out, "scrape_configs:\n  - job_name: '", options.job,
                  "'\n    static_configs:\n");
  for (const ScrapeTarget& target : options.targets) {
    absl::StrAppend(&out, "      - targets: ['", target.address, "']\n");
    if (target.labels.empty()) continue;
    absl::StrAppend(&out, "        labels:\n");
    for (const auto& [name, value] : target.labels) {
      absl::StrAppend(&out, "          ", name, ": '", value, "'\n");
    }
  }
  return out;
}

}  // namespace

bool PrometheusServer::Installed() { return ::access(kBinary, X_OK) == 0; }

PrometheusServer::PrometheusServer(std::unique_ptr<Subprocess> process,
                                   int port, std::string log_path)
    : process_(std::move(process)),
      port_(port),
      log_path_(std::move(log_path)) {}

absl::StatusOr<std::unique_ptr<PrometheusServer>> PrometheusServer::Start(
    const std::string& dir, const PrometheusOptions& options) {
  const std::string config = absl::StrCat(dir, "/prometheus.yml");
  std::ofstream(config) << Config(options);
  const int port = FreeLoopbackPort();
  if (port == 0) return absl::UnavailableError("no free loopback port");
  const std::string log_path = absl::StrCat(dir, "/prometheus.log");
  absl::StatusOr<std::unique_ptr<Subprocess>> process =
      Subprocess::Spawn({kBinary, absl::StrCat("--config.file=", config),
                         absl::StrCat("--storage.tsdb.path=", dir, "/tsdb"),
                         absl::StrCat("--web.listen-address=127.0.0.1:", port),
                         "--log.level=warn"},
                        log_path);
  if (!process.ok()) return process.status();
  auto server = std::unique_ptr<PrometheusServer>(
      new PrometheusServer(*std::move(process), port, log_path));
  for (const absl::Time deadline = absl::Now() + absl::Seconds(30);
       absl::Now() < deadline; absl::SleepFor(absl::Milliseconds(100))) {
    if (server->Api("status/runtimeinfo").ok()) return server;
  }
  return absl::UnavailableError(
      absl::StrCat("Prometheus did not answer: ", server->log()));
}

std::string PrometheusServer::log() const { return ReadFile(log_path_); }

absl::StatusOr<nlohmann::json> PrometheusServer::Api(
    const std::string& path_and_query) {
  const std::string body =
      HttpGet(port_, absl::StrCat("/api/v1/", path_and_query));
  nlohmann::json answer = nlohmann::json::parse(body, nullptr, false);
  if (answer.is_discarded() || !answer.is_object()) {
    return absl::UnavailableError(
        absl::StrCat("no JSON from /api/v1/", path_and_query, ": ", body));
  }
  if (answer.value("status", "") != "success") {
    return absl::InvalidArgumentError(absl::StrCat(
        answer.value("errorType", "?"), ": ", answer.value("error", "?")));
  }
  return answer["data"];
}

absl::StatusOr<nlohmann::json> PrometheusServer::Query(
    absl::string_view promql) {
  absl::StatusOr<nlohmann::json> data =
      Api(absl::StrCat("query?query=", UrlEncode(promql)));
  if (!data.ok()) return data.status();
  if ((*data)["resultType"] == "scalar") {
    return nlohmann::json::array(
        {{{"metric", nlohmann::json::object()}, {"value", (*data)["result"]}}});
  }
  return (*data)["result"];
}

absl::StatusOr<nlohmann::json> PrometheusServer::AwaitSample(
    absl::string_view promql, absl::Time deadline) {
  absl::StatusOr<nlohmann::json> result;
  for (;;) {
    result = Query(promql);
    if (absl::IsInvalidArgument(result.status())) return result;
    if (result.ok() && !result->empty()) return result;
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(250));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no sample of ", promql, "; last answer: ",
                   result.ok() ? result->dump() : result.status().ToString()));
}

absl::StatusOr<int> PrometheusServer::Stop() {
  process_->Signal(SIGTERM);
  return process_->Wait(absl::Seconds(20));
}

std::string UrlEncode(absl::string_view text) {
  std::string out;
  for (const char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(c);
    } else {
      absl::StrAppend(&out, "%", absl::Hex(u, absl::kZeroPad2));
    }
  }
  return out;
}

std::string WithoutForDurations(absl::string_view rules) {
  std::vector<std::string> lines = absl::StrSplit(rules, '\n');
  for (std::string& line : lines) {
    const size_t indent = line.find_first_not_of(' ');
    if (indent != std::string::npos && line.compare(indent, 4, "for:") == 0) {
      line = absl::StrCat(line.substr(0, indent), "for: 0s");
    }
  }
  return absl::StrJoin(lines, "\n");
}

int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace syncnorm::testing
