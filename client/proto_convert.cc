#include "client/proto_convert.h"

#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

void ToProto(const Moments& m, v1::Moments* out) {
  out->set_count(m.count);
  out->mutable_mean()->Assign(m.mean.begin(), m.mean.end());
  out->mutable_m2()->Assign(m.m2.begin(), m.m2.end());
}

void ToProto(const RoundUpdate& u, v1::Contribution* out) {
  if (u.momentum.has_value()) {
    out->mutable_momentum()->set_momentum_mode(
        static_cast<v1::MomentumMode>(u.momentum->mode));
    out->mutable_momentum()->set_momentum(u.momentum->momentum);
  } else {
    out->clear_momentum();
  }
  if (u.imported.has_value()) {
    v1::ImportedStats* i = out->mutable_imported_stats();
    i->set_num_batches_tracked(u.imported->num_batches_tracked);
    i->mutable_running_mean()->Assign(u.imported->mean.begin(),
                                      u.imported->mean.end());
    i->mutable_running_var()->Assign(u.imported->var.begin(),
                                     u.imported->var.end());
  } else {
    out->clear_imported_stats();
  }
}

void ToProto(const GradSums& g, v1::GradSums* out) {
  out->mutable_sum_dy()->Assign(g.sum_dy.begin(), g.sum_dy.end());
  out->mutable_sum_dy_xmu()->Assign(g.sum_dy_xmu.begin(), g.sum_dy_xmu.end());
}

GlobalMoments FromProto(const v1::GlobalMoments& m) {
  GlobalMoments g;
  g.count = m.count();
  g.mean.assign(m.mean().begin(), m.mean().end());
  g.var.assign(m.var().begin(), m.var().end());
  return g;
}

ForwardReply ForwardReplyFromProto(const v1::RoundResult& r) {
  ForwardReply reply;
  reply.global = FromProto(r.moments());
  reply.version = r.version();
  reply.missing_ranks.assign(r.missing_ranks().begin(),
                             r.missing_ranks().end());
  return reply;
}

GradSums FromProto(const v1::GradSums& g) {
  GradSums s;
  s.sum_dy.assign(g.sum_dy().begin(), g.sum_dy().end());
  s.sum_dy_xmu.assign(g.sum_dy_xmu().begin(), g.sum_dy_xmu().end());
  return s;
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

absl::StatusOr<v1::RoundResult> RoundResultStatus(v1::RoundResult r) {
  if (!r.has_error()) return r;
  const v1::RoundError& e = r.error();
  std::string message = e.message();
  if (e.missing_ranks_size() > 0 && message.find("rank") == std::string::npos) {
    absl::StrAppend(&message,
                    " (missing ranks: ", absl::StrJoin(e.missing_ranks(), ", "),
                    ")");
  }
  const int code =
      e.code() == 0 ? static_cast<int>(absl::StatusCode::kUnknown) : e.code();
  absl::Status status(static_cast<absl::StatusCode>(code), message);
  if (e.reason() != v1::RoundError::REASON_UNSPECIFIED) {
    status.SetPayload(kRoundErrorReasonUrl,
                      absl::Cord(v1::RoundError::Reason_Name(e.reason())));
  }
  return status;
}

}  // namespace syncnorm
