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
#include "grpcpp/grpcpp.h"
#include "relay/relay.h"
#include "server/domain/periodic_thread.h"
#include "server/rpc/auth.h"
#include "server/rpc/call_observer.h"
#include "server/rpc/connection_guard.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"

namespace syncnorm {

namespace relay_service_internal {

// The generated service's callback methods, with Reduce raw: its stream
// reads and writes bytes, so that a block's answer, serialized once, goes
// to each of its ranks as the same bytes. (CallbackService, with Reduce's
// typed method swapped for the raw one.)
using A = v1::Aggregator;
using S0 = A::WithCallbackMethod_GetStatsHealth<A::Service>;
using S1 = A::WithCallbackMethod_UpdateMembership<S0>;
using S2 = A::WithCallbackMethod_RestoreBackup<S1>;
using S3 = A::WithCallbackMethod_ListBackups<S2>;
using S4 = A::WithCallbackMethod_Backup<S3>;
using S5 = A::WithCallbackMethod_SetRunningStats<S4>;
using S6 = A::WithCallbackMethod_ListJobs<S5>;
using S7 = A::WithCallbackMethod_RestoreCheckpoint<S6>;
using S8 = A::WithCallbackMethod_ListCheckpoints<S7>;
using S9 = A::WithCallbackMethod_Checkpoint<S8>;
using S10 = A::WithCallbackMethod_GetRunningStats<S9>;
using S11 = A::WithCallbackMethod_ReduceOnce<S10>;
using S12 = A::WithRawCallbackMethod_Reduce<S11>;
using S13 = A::WithCallbackMethod_DeleteJob<S12>;
using S14 = A::WithCallbackMethod_GetJob<S13>;
using Base = A::WithCallbackMethod_CreateJob<S14>;

}  // namespace relay_service_internal

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

// On gRPC's callback API: a Reduce stream's answers go out one write at a
// time, in the order its rounds answer. Thread-safe.
//
// A Reduce stream without a token in force (with a tokens file) ends
// UNAUTHENTICATED before it takes a --max_streams slot, as the
// aggregator's; past --max_streams it ends RESOURCE_EXHAUSTED. A message
// over --max_message_bytes is answered RESOURCE_EXHAUSTED in-band (the
// call's status on ReduceOnce). A stream reads no more while it holds
// kHeldMessagesPerStream x --max_message_bytes or kMaxUnansweredPerStream
// contributions not yet answered and written.
class RelayService final : public relay_service_internal::Base {
 public:
  // `relay` outlives the service's calls (what it answers).
  RelayService(Relay& relay, RelayServiceOptions options);
  // REQUIRES: CloseStreams() was called, or no stream is open.
  ~RelayService() override;

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Reduce(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ReduceOnce(grpc::CallbackServerContext* context,
                                       const v1::Contribution* request,
                                       v1::RoundResult* response) override;

  // Not a relay's: UNIMPLEMENTED.
  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* context,
                                      const v1::CreateJobRequest*,
                                      v1::JobInfo*) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest*,
                                   v1::JobInfo*) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* context,
                                      const v1::DeleteJobRequest*,
                                      v1::DeleteJobResponse*) override;
  grpc::ServerUnaryReactor* GetRunningStats(
      grpc::CallbackServerContext* context, const v1::GetRunningStatsRequest*,
      v1::RunningStats*) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context,
                                       const v1::CheckpointRequest*,
                                       v1::CheckpointInfo*) override;
  grpc::ServerUnaryReactor* ListCheckpoints(
      grpc::CallbackServerContext* context, const v1::ListCheckpointsRequest*,
      v1::ListCheckpointsResponse*) override;
  grpc::ServerUnaryReactor* RestoreCheckpoint(
      grpc::CallbackServerContext* context, const v1::RestoreCheckpointRequest*,
      v1::JobInfo*) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest*,
                                     v1::ListJobsResponse*) override;
  grpc::ServerUnaryReactor* SetRunningStats(
      grpc::CallbackServerContext* context, const v1::SetRunningStatsRequest*,
      v1::RunningStats*) override;
  grpc::ServerUnaryReactor* Backup(grpc::CallbackServerContext* context,
                                   const v1::BackupRequest*,
                                   v1::BackupInfo*) override;
  grpc::ServerUnaryReactor* ListBackups(grpc::CallbackServerContext* context,
                                        const v1::ListBackupsRequest*,
                                        v1::ListBackupsResponse*) override;
  grpc::ServerUnaryReactor* RestoreBackup(grpc::CallbackServerContext* context,
                                          const v1::RestoreBackupRequest*,
                                          v1::RestoreBackupResponse*) override;
  grpc::ServerUnaryReactor* UpdateMembership(
      grpc::CallbackServerContext* context, const v1::UpdateMembershipRequest*,
      v1::JobInfo*) override;
  grpc::ServerUnaryReactor* GetStatsHealth(grpc::CallbackServerContext* context,
                                           const v1::GetStatsHealthRequest*,
                                           v1::StatsHealth*) override;

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
  // Calls CloseIdleStreams(); null without an idle timeout or once
  // CloseStreams() was called.
  std::unique_ptr<PeriodicThread> sweeper_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_RELAY_SERVICE_H_
