// The server side of one ReduceOnce call.
#ifndef SYNCNORM_SERVER_RPC_REDUCE_ONCE_REACTOR_H_
#define SYNCNORM_SERVER_RPC_REDUCE_ONCE_REACTOR_H_

#include <memory>
#include <optional>

#include "server/domain/aggregator.h"
#include "server/domain/contribution.h"
#include "server/rpc/waiting_call_reactor.h"
#include "server/rpc/waiting_calls.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// Hands one contribution to the Aggregator and finishes the call with its
// round's result, or with the round's failure as the RPC status (message
// and missing ranks included). Cancellation and lifetime: see
// WaitingCallReactor (what it holds meanwhile is the contribution in its
// round). Thread-safe.
class ReduceOnceReactor final : public WaitingCallReactor {
 public:
  // Starts the contribution. `call` finishes it; `response` is the call's
  // and valid until Finish; `aggregator` must outlive the callback.
  // `c`: the request, its relay block read and authorized
  // (RelayBlockFromProto), its round_age cleared unless the caller may set
  // it. `waiting` (null: not counted) was entered for this call.
  ReduceOnceReactor(UnaryFinisher* call, Aggregator* aggregator, Contribution c,
                    v1::RoundResult* response,
                    std::shared_ptr<WaitingCalls> waiting = nullptr);

 private:
  ~ReduceOnceReactor() override = default;

  void Answer(const Contribution& key, const RoundOutcome& outcome);

  v1::RoundResult* const response_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_REDUCE_ONCE_REACTOR_H_
