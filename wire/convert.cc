#include "wire/convert.h"

#include <vector>

#include "google/protobuf/repeated_field.h"

namespace syncnorm {
namespace {

std::vector<double> ToVector(const google::protobuf::RepeatedField<double>& f) {
  return std::vector<double>(f.begin(), f.end());
}

void Assign(const std::vector<double>& v,
            google::protobuf::RepeatedField<double>* f) {
  f->Assign(v.begin(), v.end());
}

}  // namespace

void ToProto(const Moments& m, v1::Moments& out) {
  out.set_count(m.count);
  Assign(m.mean, out.mutable_mean());
  Assign(m.m2, out.mutable_m2());
}

Moments FromProto(const v1::Moments& m) {
  Moments out;
  out.count = m.count();
  out.mean = ToVector(m.mean());
  out.m2 = ToVector(m.m2());
  return out;
}

void ToProto(const GlobalMoments& g, v1::GlobalMoments& out) {
  out.set_count(g.count);
  Assign(g.mean, out.mutable_mean());
  Assign(g.var, out.mutable_var());
}

GlobalMoments FromProto(const v1::GlobalMoments& g) {
  GlobalMoments out;
  out.count = g.count();
  out.mean = ToVector(g.mean());
  out.var = ToVector(g.var());
  return out;
}

void ToProto(const GradSums& g, v1::GradSums& out) {
  Assign(g.sum_dy, out.mutable_sum_dy());
  Assign(g.sum_dy_xmu, out.mutable_sum_dy_xmu());
}

GradSums FromProto(const v1::GradSums& g) {
  GradSums out;
  out.sum_dy = ToVector(g.sum_dy());
  out.sum_dy_xmu = ToVector(g.sum_dy_xmu());
  return out;
}

// The enums share their numbers (kernels/formulas.h, aggregator.proto);
// other values are carried as they are and rejected by validation.
void ToProto(const RunningRule& rule, v1::LayerSpec& out) {
  out.set_momentum_mode(static_cast<v1::MomentumMode>(rule.mode));
  out.set_momentum(rule.momentum);
  out.set_biased_running_var(rule.biased_var);
  out.set_no_running_stats(!rule.track);
}

RunningRule RuleFromProto(const v1::LayerSpec& spec) {
  RunningRule rule;
  rule.mode = static_cast<MomentumMode>(spec.momentum_mode());
  rule.momentum = spec.momentum();
  rule.biased_var = spec.biased_running_var();
  rule.track = !spec.no_running_stats();
  return rule;
}

void ToProto(const RunningStats& s, v1::LayerStats& out) {
  out.set_num_batches_tracked(s.num_batches_tracked);
  Assign(s.mean, out.mutable_running_mean());
  Assign(s.var, out.mutable_running_var());
}

RunningStats FromProto(const v1::LayerStats& l) {
  return RunningStats{l.num_batches_tracked(), ToVector(l.running_mean()),
                      ToVector(l.running_var())};
}

void ToProto(const RunningStats& s, v1::ImportedStats& out) {
  out.set_num_batches_tracked(s.num_batches_tracked);
  Assign(s.mean, out.mutable_running_mean());
  Assign(s.var, out.mutable_running_var());
}

RunningStats FromProto(const v1::ImportedStats& i) {
  return RunningStats{i.num_batches_tracked(), ToVector(i.running_mean()),
                      ToVector(i.running_var())};
}

void ToProto(const RoundUpdate& u, v1::Contribution& out) {
  if (u.momentum.has_value()) {
    v1::RoundMomentum* m = out.mutable_momentum();
    m->set_momentum_mode(static_cast<v1::MomentumMode>(u.momentum->mode));
    m->set_momentum(u.momentum->momentum);
  } else {
    out.clear_momentum();
  }
  if (u.imported.has_value()) {
    ToProto(*u.imported, *out.mutable_imported_stats());
  } else {
    out.clear_imported_stats();
  }
}

RoundUpdate RoundUpdateFromProto(const v1::Contribution& c) {
  RoundUpdate u;
  if (c.has_momentum()) {
    u.momentum =
        RoundMomentum{static_cast<MomentumMode>(c.momentum().momentum_mode()),
                      c.momentum().momentum()};
  }
  if (c.has_imported_stats()) u.imported = FromProto(c.imported_stats());
  return u;
}

}  // namespace syncnorm
