#include "server/rpc/encoded_result.h"

#include <string>

#include "grpcpp/impl/codegen/proto_utils.h"  // SerializationTraits<proto>
#include "server/rpc/proto_convert.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

namespace {

grpc::ByteBuffer Encode(const Contribution& key, const RoundOutcome& outcome) {
  v1::RoundResult result;
  RoundResultToProto(key, outcome, result);
  grpc::ByteBuffer bytes;
  bool own = false;
  // Fails only past 2 GiB, which --max_message_bytes keeps results far
  // below; an empty buffer would then be a RoundResult without an outcome.
  (void)grpc::SerializationTraits<v1::RoundResult>::Serialize(result, &bytes,
                                                              &own);
  return bytes;
}

// What a thread encoded last: the outcome's serial and the fields of the
// key that the result echoes.
struct LastEncoded {
  uint64_t serial = 0;
  std::string job_id;
  int layer = 0;
  int64_t step = 0;
  Phase phase = Phase::kForward;
  int backward = 0;
  grpc::ByteBuffer bytes;

  bool Matches(const Contribution& key, uint64_t s) const {
    return s == serial && key.layer == layer && key.step == step &&
           key.phase == phase && key.backward == backward &&
           key.job_id == job_id;
  }
};

}  // namespace

grpc::ByteBuffer EncodedResult(const Contribution& key,
                               const RoundOutcome& outcome) {
  if (outcome.serial == 0) return Encode(key, outcome);
  thread_local LastEncoded last;
  if (!last.Matches(key, outcome.serial)) {
    last.bytes = Encode(key, outcome);
    last.serial = outcome.serial;
    last.job_id = key.job_id;
    last.layer = key.layer;
    last.step = key.step;
    last.phase = key.phase;
    last.backward = key.backward;
  }
  return last.bytes;
}

}  // namespace syncnorm
