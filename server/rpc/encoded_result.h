// A round's answer on the wire, encoded once for all of its callers.
#ifndef SYNCNORM_SERVER_RPC_ENCODED_RESULT_H_
#define SYNCNORM_SERVER_RPC_ENCODED_RESULT_H_

#include "grpcpp/support/byte_buffer.h"
#include "server/domain/contribution.h"

namespace syncnorm {

// The serialized syncnorm.v1.RoundResult that answers `key` with `outcome`
// (RoundResultToProto). An outcome with a serial, which every contributor
// of its round gets, is encoded once per thread: the callers after the
// first on that thread get the same bytes, shared, not copied (a
// ByteBuffer holds references to its slices). A round's answers are
// delivered one after another on one thread, so a round of W ranks
// encodes its answer once, not W times, and W streams hold one copy of it.
// The thread keeps the last answer it encoded until it encodes another.
// Thread-safe.
grpc::ByteBuffer EncodedResult(const Contribution& key,
                               const RoundOutcome& outcome);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_ENCODED_RESULT_H_
