// Which client connections to close, judged from what their calls do: the
// server's defence against the floods that gRPC 1.51's transport lets
// through (HTTP/2 rapid reset, more streams than the advertised limit from
// a client that never acknowledged it, token guessing, calls to methods the
// server does not serve). It knows a
// connection by its peer address (gRPC's peer string, "ipv4:10.0.0.7:51234")
// and closes it through a ConnectionCloser. Knows nothing else of gRPC.
#ifndef SYNCNORM_SERVER_RPC_CONNECTION_GUARD_H_
#define SYNCNORM_SERVER_RPC_CONNECTION_GUARD_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/domain/clock.h"

namespace syncnorm {

// Closes one client connection of the server. Thread-safe.
class ConnectionCloser {
 public:
  virtual ~ConnectionCloser() = default;
  // Closes the connection from `peer`; false if there is none.
  virtual bool Close(absl::string_view peer) = 0;
};

struct ConnectionGuardOptions {
  // The server is overloaded while it holds more calls than this (from
  // each call's arrival to its end; see RpcLoop). <= 0: never overloaded.
  // The server sets it to what its limits let legitimate clients hold:
  // --max_streams + --max_waiting_calls + 1024 calls answered at once.
  int64_t max_calls = 0;
  // While the server is overloaded, a connection that starts more calls
  // than this is closed: gRPC takes requests from a connection as fast as
  // they come, whatever the server has left. Default 256.
  int overload_calls = 256;
  // A connection whose client has cancelled at least this many calls
  // within kEarlyCancel of their start, more than half of the calls it
  // started, is closed (HTTP/2 rapid reset: requests sent and reset at
  // once). Streams cancelled later, as a broken connection ends them, do
  // not count. Default 128.
  int early_cancels = 128;
  // A connection with this many calls refused UNAUTHENTICATED (no token,
  // an unknown one) is closed. Default 64.
  int unauthenticated_calls = 64;
  // A connection with this many calls refused UNIMPLEMENTED by the service
  // (a method it does not serve: the relay's, which serves rounds only) is
  // closed. Such a call gives nothing back, however quickly it is refused.
  // Default 64.
  int unimplemented_calls = 64;
};

// kReadFlood: the connection kept the server's one polling thread reading
// it while the server's memory grew far past what it sent (read_flood.h).
enum class CloseReason {
  kOverload,
  kRapidReset,
  kUnauthenticated,
  kReadFlood,
  kUnimplemented,
};
inline constexpr int kCloseReasons = 5;
const char* CloseReasonName(CloseReason reason);

// Counts every connection's calls and closes, once, a connection that
// crosses one of ConnectionGuardOptions' lines, logging why
// (event=connection_closed). Only TCP peers ("ipv4:", "ipv6:") are judged:
// connections over a Unix socket are local and share one peer string.
// Keeps a record per connection while it has calls, and a minute after.
// Thread-safe.
class ConnectionGuard {
 public:
  // One connection's record; CallStarted hands it out, CallEnded takes it.
  struct Connection;

  // `closer` and `clock` must outlive the guard.
  ConnectionGuard(ConnectionGuardOptions options, ConnectionCloser* closer,
                  const Clock* clock);
  ~ConnectionGuard();

  // A call has arrived / is over (RpcLoop).
  void CallArrived() { held_.fetch_add(1, std::memory_order_relaxed); }
  void CallReleased() { held_.fetch_sub(1, std::memory_order_relaxed); }
  // Calls gRPC holds for the service now.
  int64_t calls_held() const { return held_.load(std::memory_order_relaxed); }

  // A call from `peer` starts; null when `peer` is not judged.
  std::shared_ptr<Connection> CallStarted(absl::string_view peer)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The call ended with `code`, as its client got it (CallOutcome), after
  // `lifetime`. REQUIRES: `connection` came from CallStarted, once per
  // call.
  void CallEnded(Connection& connection, absl::StatusCode code,
                 absl::Duration lifetime) ABSL_LOCKS_EXCLUDED(mu_);

  // A call of `connection` that streams its answers sent one (a Reduce
  // stream's result): the connection gives back as one whose call ended
  // answered does.
  void MessageAnswered(Connection& connection) ABSL_LOCKS_EXCLUDED(mu_);

  // Closes the connection from `peer` for `reason`, once, as if it had
  // crossed a line: its calls still to come are not judged again.
  void Close(absl::string_view peer, CloseReason reason)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A call cancelled this soon after its start counts as an early cancel.
  static constexpr absl::Duration kEarlyCancel = absl::Seconds(1);

  // Connections closed so far for `reason`.
  int64_t closed(CloseReason reason) const {
    return closed_[static_cast<int>(reason)].load(std::memory_order_relaxed);
  }
  // Connections with a record now.
  int tracked() const ABSL_LOCKS_EXCLUDED(mu_);

  // The peers of the connections that give back what they cost: each has
  // had calls answered (ended with a status the service sent, other than
  // UNAUTHENTICATED, UNIMPLEMENTED or DEADLINE_EXCEEDED, or streamed an
  // answer; see MessageAnswered), more of them than its calls refused
  // UNAUTHENTICATED or UNIMPLEMENTED, cancelled early and still in
  // progress together (a
  // flood whose first calls were answered holds thousands whose answers
  // its client does not read), and is not closed. A
  // connection without a record (no call yet, or none for a minute) is not
  // among them.
  absl::flat_hash_set<std::string> PeersGivingBack() const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The record of the connection from `peer`: made if there is none, made
  // afresh if it was closed long enough ago to be a new connection's.
  std::shared_ptr<Connection>& RecordLocked(absl::string_view peer,
                                            absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks `c` closed and returns true if it crossed a line; what to log.
  bool Judge(Connection& c, bool overloaded, CloseReason& reason) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a connection's log line says of it.
  struct Counts {
    int64_t started = 0;
    int64_t early_cancels = 0;
    int64_t unauthenticated = 0;
    int64_t unimplemented = 0;
  };
  static Counts CountsOf(const Connection& c);
  void CloseConnection(const std::string& peer, CloseReason reason,
                       const Counts& counts) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the records of connections without calls for a minute.
  void PruneLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const ConnectionGuardOptions options_;
  ConnectionCloser* const closer_;
  const Clock* const clock_;

  std::atomic<int64_t> held_{0};
  std::array<std::atomic<int64_t>, kCloseReasons> closed_{};

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Connection>> connections_
      ABSL_GUARDED_BY(mu_);
  absl::Time next_prune_ ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_CONNECTION_GUARD_H_
