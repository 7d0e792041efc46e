// The server's RPC threading: one completion queue and the one thread that
// polls it and runs every call's reactions, plus a few worker threads for
// the calls that may take long.
//
// Why one thread (bench/RESULTS.md, "What bounds the round now"): gRPC
// 1.51's callback API on Linux runs callbacks on at least two threads
// that each poll the process's one epoll set and wake each other, about
// five context switches per round. A single thread that polls and handles
// what it polls has nothing to wake: a W = 2 round took 0.62-0.70x the
// time. That holds only while it is the one polling thread in the
// process, so no service of the server may be on the callback API (it
// would start gRPC's callback threads) and the workers never poll.
#ifndef SYNCNORM_SERVER_RPC_RPC_LOOP_H_
#define SYNCNORM_SERVER_RPC_RPC_LOOP_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/server_context.h"
#include "server/rpc/call_outcome.h"
#include "server/rpc/read_flood.h"

namespace syncnorm {

class ConnectionGuard;

// What the loop's completion queue returns: each tag the server hands
// gRPC is one of these, and the loop runs it.
class CqTag {
 public:
  virtual void Run(bool ok) = 0;

 protected:
  ~CqTag() = default;
};

// Thread-safe.
class RpcLoop {
 public:
  // `guard` (null: none) counts the calls the loop holds, from their
  // arrival to their end; it must outlive the loop. `workers`: threads for
  // Post(). `watcher` (null: none; must outlive the loop) is told of
  // passes through gRPC that keep the loop's thread from its calls.
  RpcLoop(std::unique_ptr<grpc::ServerCompletionQueue> cq,
          ConnectionGuard* guard, int workers, PassWatcher* watcher = nullptr);

  // The watchdog looks at the loop's thread this often. While the thread
  // stays inside gRPC (polling the queue) without returning an event, and
  // busy (on a CPU for at least a tenth of the time of the last
  // kBusyWindow looks), the watcher is told at each look (read_flood.h).
  static constexpr absl::Duration kWatchPeriod = absl::Milliseconds(5);
  static constexpr size_t kBusyWindow = 5;
  // While the thread sleeps through look after look (an idle server), the
  // watcher is told it serves at every kIdleLooks-th of them only (every
  // 100 ms), with the process's memory then: nothing was read meanwhile.
  static constexpr int kIdleLooks = 20;

  // REQUIRES: Stop() returned, or Start() was never called.
  ~RpcLoop();

  grpc::ServerCompletionQueue* cq() const { return cq_.get(); }

  // Starts the threads; once the server is built and the services have
  // posted their first requests.
  void Start();
  // Once grpc::Server::Shutdown has returned: waits until every call is
  // over (the server cancelled those left; their reactors finish them, on
  // this loop), then shuts the queue down, drains it, and joins the
  // threads. gRPC's Shutdown returns once the connections are closed,
  // which may be before the calls' last operations are started, and none
  // may be started on a queue that is shut down.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // A call arrived / is over (also for ConnectionGuard::calls_held).
  void CallArrived() ABSL_LOCKS_EXCLUDED(mu_);
  void CallReleased() ABSL_LOCKS_EXCLUDED(mu_);

  // Runs `work` on a worker thread, in the order posted; never on the
  // loop's thread. After Stop(), runs nothing.
  void Post(std::function<void()> work) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Poll();
  void Work() ABSL_LOCKS_EXCLUDED(mu_);
  void Watch() ABSL_LOCKS_EXCLUDED(watch_mu_);

  const std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  ConnectionGuard* const guard_;
  const int workers_;
  PassWatcher* const watcher_;
  std::thread poller_;
  std::thread watchdog_;
  std::vector<std::thread> threads_;
  // Written by the loop's thread, read by the watchdog.
  std::atomic<bool> in_grpc_{false};
  std::atomic<int64_t> events_{0};

  absl::Mutex mu_;
  std::deque<std::function<void()>> work_ ABSL_GUARDED_BY(mu_);
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;  // arrived, not yet over
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex watch_mu_;
  bool watch_stop_ ABSL_GUARDED_BY(watch_mu_) = false;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_RPC_LOOP_H_
