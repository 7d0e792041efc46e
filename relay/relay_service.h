// syncnorm.v1.Aggregator as a relay serves it: rounds (Reduce, ReduceOnce)
// go to the Relay; every other method is UNIMPLEMENTED, naming where to
// send it.
#ifndef SYNCNORM_RELAY_RELAY_SERVICE_H_
#define SYNCNORM_RELAY_RELAY_SERVICE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "relay/relay.h"
#include "server/domain/periodic_thread.h"
#include "server/rpc/auth.h"
#include "server/rpc/call_observer.h"
#include "server/rpc/connection_guard.h"
#include "server/rpc/rpc_loop.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"

namespace syncnorm {

struct RelayServiceOptions {
  // Null: no token check. Outlives the service's calls.
  const Authenticator* auth = nullptr;
  // The bounds of RelayOptions of the same names (relay_options.h); zero
  // or less: none.
  int max_streams = 0;
  int max_waiting_calls = 0;
  int64_t max_message_bytes = 0;
  absl::Duration stream_idle_timeout = absl::ZeroDuration();
  // Told of each Reduce stream, which gRPC's interceptors skip
  // (server/rpc/call_observer.h): the connection guard's and the
  // metrics'. They outlive the service's calls.
  std::vector<CallObserverFactory*> call_observers;
  // Told of each Reduce and ReduceOnce call held (CallArrived, then
  // CallReleased once the relay holds nothing of it). Null: none.
  ConnectionGuard* guard = nullptr;
};

// What the service took and answered since it started, and holds now.
struct RelayServiceCounters {
  // Contributions read (Reduce messages and ReduceOnce requests).
  int64_t contributions = 0;
  // Answers given, by code (0: OK); and of them the relay's own refusals,
  // given without a shard's answer: its limits, tokens, the message bound,
  // a relay block.
  std::array<int64_t, 17> answers{};
  std::array<int64_t, 17> refusals{};
  // Reduce streams holding a --max_streams slot, ReduceOnce calls holding
  // a --max_waiting_calls slot.
  int64_t open_streams = 0;
  int64_t waiting_calls = 0;
  // Bytes the streams hold: contributions read and not yet answered, and
  // answers not yet written.
  int64_t held_bytes = 0;
  // Streams ended for --stream_idle_timeout_ms.
  int64_t idle_streams_closed = 0;
};

// Served by an RpcLoop (server/rpc/rpc_loop.h), as the aggregator: every
// reaction on its one thread, which also runs the relay's merges and the
// answers it fans out. Reduce is raw: its stream reads and writes bytes, so
// that a block's answer, serialized once, goes to each of its ranks as the
// same bytes. A Reduce stream's answers go out one write at a time, in the
// order its rounds answer. Thread-safe.
//
// A Reduce stream without a token in force (with a tokens file) ends
// UNAUTHENTICATED before it takes a --max_streams slot, as the
// aggregator's; past --max_streams it ends RESOURCE_EXHAUSTED. A message
// over --max_message_bytes is answered RESOURCE_EXHAUSTED in-band (the
// call's status on ReduceOnce). A stream reads no more while it holds
// kHeldMessagesPerStream x --max_message_bytes or kMaxUnansweredPerStream
// contributions not yet answered and written. Every other method of
// syncnorm.v1.Aggregator is UNIMPLEMENTED, naming where to send it.
class RelayService final : public v1::Aggregator::WithRawMethod_Reduce<
                               v1::Aggregator::AsyncService> {
 public:
  // `relay` outlives the service's calls (what it answers).
  RelayService(Relay& relay, RelayServiceOptions options);
  // REQUIRES: CloseStreams() was called, or no stream is open.
  ~RelayService() override;

  // Posts a request for each method's first call on `loop`, which must
  // outlive the calls (grpc::Server::Shutdown ends them). Once.
  void Listen(RpcLoop* loop);

  // Shutdown: ends every open stream UNAVAILABLE once it has answered and
  // written all it read, and refuses new ones (UNAVAILABLE); stops ending
  // idle ones. Idempotent.
  void CloseStreams();

  // Ends the streams idle for --stream_idle_timeout_ms now (what the
  // service's thread does every quarter of it); returns how many.
  int CloseIdleStreams();

  RelayServiceCounters counters() const;

  // What the service and its calls share: it outlives the last of them.
  struct State;

 private:
  const std::shared_ptr<State> state_;
  // The methods' listeners, which their calls use (set by Listen).
  std::vector<std::shared_ptr<void>> methods_;
  // Calls CloseIdleStreams(); null without an idle timeout or once
  // CloseStreams() was called.
  std::unique_ptr<PeriodicThread> sweeper_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_RELAY_SERVICE_H_
