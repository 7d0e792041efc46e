#include "relay/relay_metrics.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "prometheus/text_serializer.h"
#include "server/metrics/families.h"
#include "server/metrics/process_metrics.h"
#include "syncnorm_version.h"

namespace syncnorm {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

MetricFamily One(const char* name, const char* help, MetricType type,
                 int64_t value) {
  MetricFamily f = NewFamily(name, help, type);
  AddSample(f, static_cast<double>(value));
  return f;
}

const char* MethodName(int method) {
  return method == UpstreamCounters::kGetJob ? "GetJob" : "ReduceOnce";
}

}  // namespace

std::vector<MetricFamily> RelayFamilies(const RelayLoad& load) {
  std::vector<MetricFamily> out;
  const RelayServiceCounters& s = load.service;
  out.push_back(One("syncnorm_relay_contributions_total",
                    "Contributions the relay read from its ranks (Reduce "
                    "messages and ReduceOnce requests).",
                    MetricType::Counter, s.contributions));
  MetricFamily answers = NewFamily(
      "syncnorm_relay_answers_total",
      "Answers the relay gave its ranks, by code: OK, the shard's error "
      "passed on, or the relay's own refusal.",
      MetricType::Counter);
  MetricFamily refusals = NewFamily(
      "syncnorm_relay_refusals_total",
      "Contributions and streams the relay refused itself, by code: "
      "RESOURCE_EXHAUSTED past a bound (the message names the flag), "
      "UNAUTHENTICATED or PERMISSION_DENIED for a token, INVALID_ARGUMENT "
      "for a relay block, UNAVAILABLE while it shuts down.",
      MetricType::Counter);
  for (int code = 0; code < 17; ++code) {
    if (code == 0 || s.answers[code] > 0) {
      AddSample(answers, static_cast<double>(s.answers[code]),
                {{"code", CodeName(code)}});
    }
    if (code == static_cast<int>(absl::StatusCode::kResourceExhausted) ||
        s.refusals[code] > 0) {
      AddSample(refusals, static_cast<double>(s.refusals[code]),
                {{"code", CodeName(code)}});
    }
  }
  out.push_back(std::move(answers));
  out.push_back(std::move(refusals));

  const RelayCounters& r = load.relay;
  out.push_back(One("syncnorm_relay_blocks_forwarded_total",
                    "Complete blocks merged into one contribution and sent "
                    "to their shard.",
                    MetricType::Counter, r.blocks_forwarded));
  MetricFamily passed = NewFamily(
      "syncnorm_relay_passed_through_total",
      "Contributions sent to their shard unmerged, by reason: unknown_job "
      "(GetJob failed), not_mergeable (the shard takes no blocks, a "
      "stale-synchronous job, a block of one member), late (its block round "
      "was answered), resend, incomplete (the block was incomplete at the "
      "quorum's grace or the round timeout), members_changed, unmergeable "
      "(payloads or updates that do not merge), refused_by_shard.",
      MetricType::Counter);
  for (int why = 0; why < kPassReasons; ++why) {
    AddSample(passed, static_cast<double>(r.passed_through_by[why]),
              {{"reason", PassReasonName(static_cast<PassReason>(why))}});
  }
  out.push_back(std::move(passed));
  out.push_back(One("syncnorm_relay_block_rounds",
                    "Block rounds the relay holds: waiting for their ranks or "
                    "for the shard's answer.",
                    MetricType::Gauge, r.open_blocks));
  out.push_back(One("syncnorm_relay_jobs",
                    "(job, shard) pairs the relay knows (at most --max_jobs).",
                    MetricType::Gauge, r.jobs));

  const UpstreamCounters& u = load.upstream;
  MetricFamily calls = NewFamily(
      "syncnorm_relay_upstream_calls_total",
      "Calls the relay made to its shards, by method; a resend counts once.",
      MetricType::Counter);
  MetricFamily failures = NewFamily(
      "syncnorm_relay_upstream_failures_total",
      "Calls to the shards that failed after their resends, by method and "
      "code; a TLS mismatch is FAILED_PRECONDITION.",
      MetricType::Counter);
  for (int m = 0; m < UpstreamCounters::kMethods; ++m) {
    AddSample(calls, static_cast<double>(u.calls[m]),
              {{"method", MethodName(m)}});
    for (int code = 1; code < 17; ++code) {
      if (u.failures[m][code] > 0) {
        AddSample(failures, static_cast<double>(u.failures[m][code]),
                  {{"method", MethodName(m)}, {"code", CodeName(code)}});
      }
    }
  }
  out.push_back(std::move(calls));
  out.push_back(One("syncnorm_relay_upstream_retries_total",
                    "ReduceOnce calls to the shards resent after UNAVAILABLE "
                    "(a shard down or restarting).",
                    MetricType::Counter, u.retries));
  out.push_back(std::move(failures));

  out.push_back(One("syncnorm_relay_open_streams",
                    "Reduce streams holding a slot (at most --max_streams); a "
                    "stream whose client left keeps it while the relay holds "
                    "its contributions.",
                    MetricType::Gauge, s.open_streams));
  out.push_back(
      One("syncnorm_relay_waiting_calls",
          "ReduceOnce calls in progress (at most --max_waiting_calls).",
          MetricType::Gauge, s.waiting_calls));
  out.push_back(One("syncnorm_relay_held_bytes",
                    "Bytes the streams hold: contributions read and not yet "
                    "answered, answers not yet written (each stream reads no "
                    "more past 4 x --max_message_bytes).",
                    MetricType::Gauge, s.held_bytes));
  out.push_back(One("syncnorm_relay_idle_streams_closed_total",
                    "Reduce streams ended for --stream_idle_timeout_ms.",
                    MetricType::Counter, s.idle_streams_closed));
  out.push_back(One("syncnorm_relay_grpc_calls",
                    "Reduce and ReduceOnce calls the relay holds, from their "
                    "arrival until it holds nothing of them.",
                    MetricType::Gauge, load.grpc_calls));
  MetricFamily closed = NewFamily(
      "syncnorm_relay_connections_closed_total",
      "Client connections the relay closed for abuse: overload, rapid_reset "
      "(calls cancelled as they were sent), unauthenticated (calls without "
      "a valid token), as the aggregator.",
      MetricType::Counter);
  for (int reason = 0; reason < kCloseReasons; ++reason) {
    AddSample(closed, static_cast<double>(load.connections_closed[reason]),
              {{"reason", CloseReasonName(static_cast<CloseReason>(reason))}});
  }
  out.push_back(std::move(closed));
  return out;
}

std::vector<MetricFamily> RelayConstantFamilies(const RelayOptions& o) {
  MetricFamily limit =
      NewFamily("syncnorm_relay_limit",
                "The relay's bounds by flag name (0: none); see "
                "syncnorm_relay_open_streams, syncnorm_relay_waiting_calls, "
                "syncnorm_relay_jobs.",
                MetricType::Gauge);
  auto flag = [&limit](const char* name, int64_t value) {
    AddSample(limit, value > 0 ? static_cast<double>(value) : 0,
              {{"flag", name}});
  };
  flag("max_streams", o.max_streams);
  flag("max_waiting_calls", o.max_waiting_calls);
  flag("max_message_bytes", o.max_message_bytes);
  flag("max_transport_bytes", o.max_transport_bytes);
  flag("max_streams_per_connection", o.max_streams_per_connection);
  flag("stream_idle_timeout_ms",
       absl::ToInt64Milliseconds(o.stream_idle_timeout));
  flag("max_pending_blocks_per_job", o.max_pending_blocks_per_job);
  flag("max_jobs", o.max_jobs);
  MetricFamily build =
      NewFamily("syncnorm_relay_build_info",
                "1, labelled with the relay's version.", MetricType::Gauge);
  AddSample(build, 1, {{"version", kSyncnormVersion}});
  return {std::move(limit), std::move(build)};
}

RelayMetrics::RelayMetrics(const RelayOptions& options)
    : registry_(std::make_shared<prometheus::Registry>()),
      grpc_(*registry_),
      constant_(RelayConstantFamilies(options)) {}

RelayMetrics::~RelayMetrics() {
  http_.reset();  // no scrape from here on
}

absl::StatusOr<std::unique_ptr<RelayMetrics>> RelayMetrics::Start(
    const RelayOptions& options) {
  auto metrics = std::unique_ptr<RelayMetrics>(new RelayMetrics(options));
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
      MetricsHttpServer::Start(options.metrics_listen,
                               [m = metrics.get()] { return m->Render(); });
  if (!http.ok()) return http.status();
  metrics->http_ = *std::move(http);
  metrics->port_ = metrics->http_->port();
  return metrics;
}

void RelayMetrics::SetSource(Source source) {
  absl::MutexLock lock(&mu_);
  source_ = std::move(source);
}

std::string RelayMetrics::Render() const {
  std::vector<MetricFamily> families = registry_->Collect();
  for (const MetricFamily& f : constant_) families.push_back(f);
  {
    absl::MutexLock lock(&mu_);  // the source stays valid while it is read
    if (source_) {
      for (MetricFamily& f : RelayFamilies(source_())) {
        families.push_back(std::move(f));
      }
    }
  }
  for (MetricFamily& f : CollectProcessMetrics()) {
    families.push_back(std::move(f));
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace syncnorm
