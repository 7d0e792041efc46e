// The answers a relay gives its ranks: the shard's RoundResult as it came,
// or a failure put in-band as the aggregator puts it.
#ifndef SYNCNORM_RELAY_ANSWERS_H_
#define SYNCNORM_RELAY_ANSWERS_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// One answer, serialized once and shared by every rank it goes to (a
// block's answer carries no rank: the same bytes for each).
struct EncodedAnswer {
  v1::RoundResult result;
  grpc::ByteBuffer bytes;  // `result` as the wire carries it
};
using RoundAnswer = std::shared_ptr<const EncodedAnswer>;

// `result`, serialized once.
RoundAnswer MakeAnswer(v1::RoundResult result);

// Receives a contribution's answer; called exactly once.
using AnswerFn = std::function<void(const RoundAnswer&)>;

// The ranks a status message names as RankList writes them after "ranks "
// ("deadline waiting for ranks [2, 5-7]", "... (missing ranks [3])"):
// ascending. Empty when it names none, or only some ("and N more").
std::vector<int> MissingRanksOf(absl::string_view message);

// The answer to `key`'s contribution (job, layer, step, phase and
// backward index echoed) that failed with `status`, as RoundResult.error:
// code and message as they are, and for DEADLINE_EXCEEDED the missing
// ranks the message names. REQUIRES: !status.ok().
RoundAnswer ErrorAnswer(const v1::Contribution& key,
                        const absl::Status& status);

// The status of a ReduceOnce call, as an absl::Status.
absl::Status FromGrpc(const grpc::Status& status);

// A ReduceOnce caller's status for `answer`: OK, or its error's code and
// message (which names the missing ranks), as the aggregator's ReduceOnce.
grpc::Status UnaryStatus(const v1::RoundResult& answer);

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_ANSWERS_H_
