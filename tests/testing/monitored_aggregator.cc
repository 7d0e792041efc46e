#include "tests/testing/monitored_aggregator.h"

#include <cstdlib>
#include <fstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "tests/testing/scrape.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {
namespace {

constexpr char kLivePod[] = "syncnorm-aggregator-0";

// The names after "- alert:" in a rule file's text.
std::vector<std::string> AlertNames(absl::string_view rules) {
  std::vector<std::string> names;
  for (absl::string_view line : absl::StrSplit(rules, '\n')) {
    line = absl::StripLeadingAsciiWhitespace(line);
    if (absl::ConsumePrefix(&line, "- alert:")) {
      names.emplace_back(absl::StripAsciiWhitespace(line));
    }
  }
  return names;
}

}  // namespace

std::string MonitoringFile(const std::string& name) {
  const char* runfiles = std::getenv("TEST_SRCDIR");
  return absl::StrCat(runfiles != nullptr ? runfiles : ".",
                      "/syncnorm/deploy/monitoring/", name);
}

absl::StatusOr<std::unique_ptr<MonitoredAggregator>> MonitoredAggregator::Start(
    const std::string& dir, const Options& options) {
  auto self = std::unique_ptr<MonitoredAggregator>(new MonitoredAggregator);
  std::vector<std::string> flags = {"--metrics_listen=127.0.0.1:0"};
  flags.insert(flags.end(), options.aggregator_flags.begin(),
               options.aggregator_flags.end());
  absl::StatusOr<std::unique_ptr<AggregatorProcess>> aggregator =
      AggregatorProcess::Start(dir, flags);
  if (!aggregator.ok()) return aggregator.status();
  self->aggregator_ = *std::move(aggregator);
  self->metrics_port_ = MetricsPortFromLog(dir + "/aggregator.log");
  if (self->metrics_port_ <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "no metrics port in the log: ", ReadFile(dir + "/aggregator.log")));
  }

  const std::string rules = ReadFile(MonitoringFile("syncnorm-alerts.yaml"));
  self->file_alerts_ = AlertNames(rules);
  if (self->file_alerts_.empty()) {
    return absl::NotFoundError("no alerts in syncnorm-alerts.yaml");
  }
  PrometheusOptions prometheus;
  prometheus.rule_files = {dir + "/syncnorm-alerts.yaml"};
  std::ofstream(prometheus.rule_files[0]) << WithoutForDurations(rules);
  if (!options.more_rules.empty()) {
    prometheus.rule_files.push_back(dir + "/more-rules.yaml");
    std::ofstream(prometheus.rule_files[1]) << options.more_rules;
  }
  prometheus.targets = {{absl::StrCat("127.0.0.1:", self->metrics_port_),
                         {{"namespace", "syncnorm"}, {"pod", kLivePod}}}};
  prometheus.targets.insert(prometheus.targets.end(),
                            options.more_targets.begin(),
                            options.more_targets.end());
  absl::StatusOr<std::unique_ptr<PrometheusServer>> server =
      PrometheusServer::Start(dir, prometheus);
  if (!server.ok()) return server.status();
  self->prometheus_ = *std::move(server);
  absl::StatusOr<nlohmann::json> up = self->prometheus_->AwaitSample(
      absl::StrCat("up{pod=\"", kLivePod, "\"} == 1"),
      absl::Now() + absl::Seconds(30));
  if (!up.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "Prometheus did not scrape the aggregator: ", up.status().message(),
        "\n", self->prometheus_->log()));
  }
  return self;
}

absl::StatusOr<std::vector<LoadedAlert>> MonitoredAggregator::EvaluatedAlerts(
    absl::Time deadline) {
  for (;;) {
    absl::StatusOr<nlohmann::json> data = prometheus_->Api("rules?type=alert");
    if (!data.ok()) return data.status();
    std::vector<LoadedAlert> alerts;
    std::vector<std::string> unevaluated;
    for (const nlohmann::json& group : (*data)["groups"]) {
      if (!absl::EndsWith(group.value("file", ""), "/syncnorm-alerts.yaml")) {
        continue;
      }
      for (const nlohmann::json& rule : group["rules"]) {
        LoadedAlert alert{rule.value("name", ""), rule.value("query", "")};
        const std::string health = rule.value("health", "");
        if (health == "err") {
          return absl::InvalidArgumentError(absl::StrCat(
              alert.name, " failed to evaluate: ", rule.value("lastError", ""),
              "\n", alert.query));
        }
        if (health != "ok") unevaluated.push_back(alert.name);
        alerts.push_back(std::move(alert));
      }
    }
    std::vector<std::string> names;
    for (const LoadedAlert& a : alerts) names.push_back(a.name);
    if (names != file_alerts_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Prometheus loaded the alerts [", absl::StrJoin(names, ", "),
          "], the file has [", absl::StrJoin(file_alerts_, ", "), "]"));
    }
    if (unevaluated.empty()) return alerts;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "not evaluated yet: ", absl::StrJoin(unevaluated, ", ")));
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
}

absl::StatusOr<nlohmann::json> MonitoredAggregator::AwaitFiring(
    absl::string_view alert, absl::Time deadline) {
  return prometheus_->AwaitSample(
      absl::StrCat("ALERTS{alertname=\"", alert, "\", alertstate=\"firing\"}"),
      deadline);
}

absl::StatusOr<int> MonitoredAggregator::Stop() {
  absl::StatusOr<int> prometheus = prometheus_->Stop();
  absl::StatusOr<int> aggregator = aggregator_->Stop();
  if (!prometheus.ok()) return prometheus.status();
  return aggregator;
}

}  // namespace syncnorm::testing
