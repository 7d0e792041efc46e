#include "server/rpc/connection_guard.h"

#include <utility>

#include "absl/strings/match.h"
#include "server/domain/log.h"

namespace syncnorm {
namespace {

// A connection's record outlives its last call by this much, so that a
// client whose calls come one at a time keeps its counts.
constexpr absl::Duration kKeepIdleRecord = absl::Minutes(1);
constexpr absl::Duration kPrunePeriod = absl::Seconds(1);
// A closed connection's calls still waiting in gRPC start within about a
// second of its close; a call that starts later comes from a new
// connection from the same address and port, which is judged afresh.
constexpr absl::Duration kNewConnectionAfter = absl::Seconds(3);

}  // namespace

const char* CloseReasonName(CloseReason reason) {
  switch (reason) {
    case CloseReason::kOverload:
      return "overload";
    case CloseReason::kRapidReset:
      return "rapid_reset";
    case CloseReason::kUnauthenticated:
      return "unauthenticated";
    case CloseReason::kReadFlood:
      return "read_flood";
    case CloseReason::kUnimplemented:
      return "unimplemented";
  }
  return "unknown";
}

// All fields are guarded by the guard's mu_.
struct ConnectionGuard::Connection {
  std::string peer;
  int64_t started = 0;
  int64_t in_progress = 0;
  int64_t early_cancels = 0;    // cancelled by the client before their end
  int64_t unauthenticated = 0;  // refused UNAUTHENTICATED
  int64_t unimplemented = 0;    // refused UNIMPLEMENTED
  int64_t answered = 0;         // ended with the service's status, or streamed
  int64_t started_overloaded = 0;  // in the current overload
  absl::Time last_seen;
  bool closed = false;
  absl::Time closed_at;
};

ConnectionGuard::ConnectionGuard(ConnectionGuardOptions options,
                                 ConnectionCloser* closer, const Clock* clock)
    : options_(options), closer_(closer), clock_(clock) {}

ConnectionGuard::~ConnectionGuard() = default;

std::shared_ptr<ConnectionGuard::Connection> ConnectionGuard::CallStarted(
    absl::string_view peer) {
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) {
    return nullptr;
  }
  const bool overloaded =
      options_.max_calls > 0 && calls_held() > options_.max_calls;
  std::shared_ptr<Connection> c;
  CloseReason reason;
  bool close = false;
  Counts counts;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    PruneLocked(now);
    c = RecordLocked(peer, now);
    ++c->started;
    ++c->in_progress;
    c->last_seen = now;
    c->started_overloaded = overloaded ? c->started_overloaded + 1 : 0;
    close = Judge(*c, overloaded, reason);
    counts = CountsOf(*c);
  }
  // peer is constant after the record is made.
  if (close) CloseConnection(c->peer, reason, counts);
  return c;
}

void ConnectionGuard::CallEnded(Connection& c, absl::StatusCode code,
                                absl::Duration lifetime) {
  CloseReason reason;
  bool close = false;
  Counts counts;
  {
    absl::MutexLock lock(&mu_);
    --c.in_progress;
    c.last_seen = clock_->Now();
    if (code == absl::StatusCode::kCancelled && lifetime < kEarlyCancel) {
      ++c.early_cancels;
    }
    if (code == absl::StatusCode::kUnauthenticated) {
      ++c.unauthenticated;
    } else if (code == absl::StatusCode::kUnimplemented) {
      ++c.unimplemented;
    } else if (code != absl::StatusCode::kCancelled &&
               code != absl::StatusCode::kDeadlineExceeded) {
      ++c.answered;  // not cut short (CallOutcome)
    }
    close = Judge(c, /*overloaded=*/false, reason);
    counts = CountsOf(c);
  }
  if (close) CloseConnection(c.peer, reason, counts);
}

void ConnectionGuard::MessageAnswered(Connection& c) {
  absl::MutexLock lock(&mu_);
  ++c.answered;
}

void ConnectionGuard::Close(absl::string_view peer, CloseReason reason) {
  Counts counts;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    Connection* c = RecordLocked(peer, now).get();
    if (c->closed) return;                    // closed a moment ago
    if (c->started == 0) c->last_seen = now;  // a record made for this
    c->closed = true;
    c->closed_at = now;
    counts = CountsOf(*c);
  }
  CloseConnection(std::string(peer), reason, counts);
}

std::shared_ptr<ConnectionGuard::Connection>& ConnectionGuard::RecordLocked(
    absl::string_view peer, absl::Time now) {
  std::shared_ptr<Connection>& c = connections_[peer];
  if (c == nullptr) {
    c = std::make_shared<Connection>();
    c->peer = std::string(peer);
  } else if (c->closed && now - c->closed_at > kNewConnectionAfter) {
    const int64_t in_progress = c->in_progress;
    *c = Connection();
    c->peer = std::string(peer);
    c->in_progress = in_progress;
  }
  return c;
}

bool ConnectionGuard::Judge(Connection& c, bool overloaded,
                            CloseReason& reason) const {
  if (c.closed) return false;
  if (overloaded && c.started_overloaded > options_.overload_calls) {
    reason = CloseReason::kOverload;
  } else if (c.early_cancels >= options_.early_cancels &&
             2 * c.early_cancels > c.started) {
    reason = CloseReason::kRapidReset;
  } else if (c.unauthenticated >= options_.unauthenticated_calls) {
    reason = CloseReason::kUnauthenticated;
  } else if (c.unimplemented >= options_.unimplemented_calls) {
    reason = CloseReason::kUnimplemented;
  } else {
    return false;
  }
  c.closed = true;
  c.closed_at = clock_->Now();
  return true;
}

ConnectionGuard::Counts ConnectionGuard::CountsOf(const Connection& c) {
  Counts counts;
  counts.started = c.started;
  counts.early_cancels = c.early_cancels;
  counts.unauthenticated = c.unauthenticated;
  counts.unimplemented = c.unimplemented;
  return counts;
}

void ConnectionGuard::CloseConnection(const std::string& peer,
                                      CloseReason reason,
                                      const Counts& counts) {
  const bool found = closer_->Close(peer);
  closed_[static_cast<int>(reason)].fetch_add(1, std::memory_order_relaxed);
  LogLine("connection_closed")
      .Add("peer", peer)
      .Add("reason", CloseReasonName(reason))
      .Add("calls", counts.started)
      .Add("early_cancels", counts.early_cancels)
      .Add("unauthenticated", counts.unauthenticated)
      .Add("unimplemented", counts.unimplemented)
      .Add("calls_held", calls_held())
      .Add("found", found ? "true" : "false");
}

void ConnectionGuard::PruneLocked(absl::Time now) {
  if (now < next_prune_) return;
  next_prune_ = now + kPrunePeriod;
  for (auto it = connections_.begin(); it != connections_.end();) {
    const Connection& c = *it->second;
    auto next = std::next(it);
    if (c.in_progress == 0 && now - c.last_seen > kKeepIdleRecord) {
      connections_.erase(it);
    }
    it = next;
  }
}

absl::flat_hash_set<std::string> ConnectionGuard::PeersGivingBack() const {
  absl::flat_hash_set<std::string> peers;
  absl::MutexLock lock(&mu_);
  for (const auto& [peer, c] : connections_) {
    if (!c->closed && c->answered > c->unauthenticated + c->unimplemented +
                                        c->early_cancels + c->in_progress) {
      peers.insert(peer);
    }
  }
  return peers;
}

int ConnectionGuard::tracked() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(connections_.size());
}

}  // namespace syncnorm
