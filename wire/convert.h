// Conversions between the kernels' host types (kernels/moments.h,
// kernels/round_update.h) and their syncnorm.v1 messages: the one copy the
// client and the server both use.
//
// Plain copies, no validation: the receiver validates what it reads (the
// server's domain, the client's contributor). Writers assign into the
// message's repeated fields, which keep their capacity, so refilling a
// reused message allocates nothing.
#ifndef SYNCNORM_WIRE_CONVERT_H_
#define SYNCNORM_WIRE_CONVERT_H_

#include "kernels/moments.h"
#include "kernels/round_update.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

void ToProto(const Moments& m, v1::Moments& out);
Moments FromProto(const v1::Moments& m);

void ToProto(const GlobalMoments& g, v1::GlobalMoments& out);
GlobalMoments FromProto(const v1::GlobalMoments& g);

void ToProto(const GradSums& g, v1::GradSums& out);
GradSums FromProto(const v1::GradSums& g);

// A layer's running-statistics rule in its LayerSpec (momentum_mode,
// momentum, biased_running_var, no_running_stats); the spec's other fields
// are left as they are. Read back as sent: an unspecified mode or a
// momentum of 0 stays so (the server's job spec resolves defaults).
void ToProto(const RunningRule& rule, v1::LayerSpec& out);
RunningRule RuleFromProto(const v1::LayerSpec& spec);

// A layer's running statistics in LayerStats (num_batches_tracked,
// running_mean, running_var); its layer, name and group are left as they
// are.
void ToProto(const RunningStats& s, v1::LayerStats& out);
RunningStats FromProto(const v1::LayerStats& l);

// Statistics a forward round imports (Contribution.imported_stats).
void ToProto(const RunningStats& s, v1::ImportedStats& out);
RunningStats FromProto(const v1::ImportedStats& i);

// A forward round's update as the contribution's momentum and
// imported_stats: each is set when the update has it and cleared when not.
void ToProto(const RoundUpdate& u, v1::Contribution& out);
// The update a contribution carries; empty when it has neither field.
RoundUpdate RoundUpdateFromProto(const v1::Contribution& c);

}  // namespace syncnorm

#endif  // SYNCNORM_WIRE_CONVERT_H_
