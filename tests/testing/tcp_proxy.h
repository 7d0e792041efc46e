// A loopback TCP proxy that can cut every connection through it at once:
// the fault and soak tests put it between workers and the aggregator to
// drop streams mid-round.
#ifndef SYNCNORM_TESTS_TESTING_TCP_PROXY_H_
#define SYNCNORM_TESTS_TESTING_TCP_PROXY_H_

#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace syncnorm::testing {

// Listens on 127.0.0.1:<free port> and forwards each connection to
// 127.0.0.1:<backend_port> (connecting anew for each, so a restarted
// backend on the same port is reached). Thread-safe.
class TcpProxy {
 public:
  static absl::StatusOr<std::unique_ptr<TcpProxy>> Start(int backend_port);
  // Cuts every connection and stops.
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  // Cuts every open connection (both sides see a reset or EOF); new ones
  // are accepted as before. Returns how many were cut.
  int DropAll() ABSL_LOCKS_EXCLUDED(mu_);
  // While held, new connections are accepted and then left silent (not
  // forwarded, not closed), as by a server whose kernel accepts before the
  // process answers: restarting, paused, or behind a stalled middlebox.
  // DropAll cuts them too.
  void HoldNew(bool hold) ABSL_LOCKS_EXCLUDED(mu_);
  // Connections accepted while held, so far.
  int held() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  TcpProxy(int listen_fd, int port, int backend_port)
      : listen_fd_(listen_fd), port_(port), backend_port_(backend_port) {}
  void AcceptLoop();
  void Pump(int client, int backend);

  const int listen_fd_;
  const int port_;
  const int backend_port_;
  std::thread acceptor_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  int held_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<int> open_ ABSL_GUARDED_BY(mu_);    // both fds of each connection
  std::set<int> silent_ ABSL_GUARDED_BY(mu_);  // held connections' fds
  // Pump threads (detached) still running.
  int active_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_TCP_PROXY_H_
