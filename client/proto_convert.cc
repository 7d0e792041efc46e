#include "client/proto_convert.h"

#include <utility>

#include "wire/convert.h"
#include "wire/round_error.h"

namespace syncnorm {

v1::Contribution MakeContribution(const std::string& job_id, int layer,
                                  int64_t step, int rank) {
  v1::Contribution c;
  c.set_job_id(job_id);
  c.set_layer(layer);
  c.set_step(step);
  c.set_phase(v1::FORWARD);
  c.set_rank(rank);
  return c;
}

ForwardReply ForwardReplyFromProto(const v1::RoundResult& r) {
  ForwardReply reply;
  reply.global = FromProto(r.moments());
  reply.version = r.version();
  reply.missing_ranks.assign(r.missing_ranks().begin(),
                             r.missing_ranks().end());
  reply.view.reserve(r.view_size());
  for (const v1::ViewEntry& v : r.view()) {
    reply.view.push_back(ForwardReply::ViewEntry{v.rank(), v.step()});
  }
  return reply;
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

absl::StatusOr<v1::RoundResult> RoundResultStatus(v1::RoundResult r) {
  if (!r.has_error()) return r;
  return RoundErrorStatus(r.error());
}

}  // namespace syncnorm
