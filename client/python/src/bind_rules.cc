// Layer specs and the running-statistics rule for Python, so that the
// Python layer mirrors the aggregator through the same formulas.
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/job_groups.h"
#include "client/job_membership.h"
#include "client/layer_spec.h"
#include "client/python/src/bindings.h"
#include "client/python/src/json_proto.h"
#include "client/python/src/py_round_update.h"
#include "client/python/src/py_status.h"
#include "client/sync_batch_norm_options.h"
#include "kernels/formulas.h"
#include "kernels/moments.h"
#include "kernels/round_update.h"
#include "pybind11/numpy.h"
#include "pybind11/stl.h"

namespace py = pybind11;

namespace syncnorm::python {
namespace {

using DoubleArray =
    py::array_t<double, py::array::c_style | py::array::forcecast>;

MomentumMode ToMode(int mode) {
  if (mode < 1 || mode > 3) {
    throw py::value_error(absl::StrCat(
        "expected momentum_mode 1 (torch), 2 (decay) or 3 (cumulative), got ",
        mode));
  }
  return static_cast<MomentumMode>(mode);
}

// The SyncBatchNormOptions fields that shape a LayerSpec, from a dict.
SyncBatchNormOptions OptionsFrom(const py::dict& d) {
  static const std::set<std::string> kKeys = {
      "num_features",        "momentum_mode",      "momentum",
      "track_running_stats", "biased_running_var", "initial_running_mean",
      "initial_running_var"};
  for (const auto& item : d) {
    const std::string key = py::str(item.first);
    if (kKeys.count(key) == 0) {
      throw py::value_error(absl::StrCat(
          "unknown layer option '", key,
          "'; expected num_features, "
          "momentum_mode, momentum, track_running_stats, biased_running_var, "
          "initial_running_mean or initial_running_var"));
    }
  }
  SyncBatchNormOptions o;
  if (d.contains("num_features"))
    o.num_features = d["num_features"].cast<int>();
  if (d.contains("momentum_mode")) {
    o.momentum_mode = ToMode(d["momentum_mode"].cast<int>());
  }
  if (d.contains("momentum")) o.momentum = d["momentum"].cast<double>();
  if (d.contains("track_running_stats")) {
    o.track_running_stats = d["track_running_stats"].cast<bool>();
  }
  if (d.contains("biased_running_var")) {
    o.biased_running_var = d["biased_running_var"].cast<bool>();
  }
  if (d.contains("initial_running_mean")) {
    o.initial_running_mean =
        d["initial_running_mean"].cast<std::vector<double>>();
  }
  if (d.contains("initial_running_var")) {
    o.initial_running_var =
        d["initial_running_var"].cast<std::vector<double>>();
  }
  return o;
}

std::string LayerSpecJson(const py::dict& options, const std::string& name,
                          int channels) {
  absl::StatusOr<v1::LayerSpec> spec =
      ToLayerSpec(OptionsFrom(options), name, channels);
  ThrowIfError(spec.status());
  return ToJson(*spec);
}

std::vector<double> Values(const DoubleArray& a, int64_t n, const char* what) {
  if (a.ndim() != 1 || a.size() != n) {
    throw py::value_error(
        absl::StrCat("expected ", what, " of ", n, " values, got ", a.size()));
  }
  return std::vector<double>(a.data(), a.data() + a.size());
}

DoubleArray ToArray(const std::vector<double>& v) {
  DoubleArray a(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

py::tuple ApplyRoundPy(int mode, double momentum, bool biased_var, bool track,
                       int64_t count, const DoubleArray& mean,
                       const DoubleArray& var, const DoubleArray& running_mean,
                       const DoubleArray& running_var,
                       int64_t num_batches_tracked,
                       const py::object& round_momentum,
                       const py::object& imported) {
  RunningRule rule;
  rule.mode = ToMode(mode);
  rule.momentum = momentum;
  rule.biased_var = biased_var;
  rule.track = track;
  const int64_t c = mean.size();
  const RoundUpdate update = RoundUpdateFrom(round_momentum, imported, c);
  ThrowIfError(CheckUpdatable(RoundRule(rule, update), count));
  GlobalMoments global{count, Values(mean, c, "mean"), Values(var, c, "var")};
  RunningStats stats{num_batches_tracked,
                     Values(running_mean, c, "running_mean"),
                     Values(running_var, c, "running_var")};
  ApplyRound(rule, update, global, stats);
  return py::make_tuple(ToArray(stats.mean), ToArray(stats.var),
                        stats.num_batches_tracked);
}

bool SameMomentumPy(int mode_a, double a, int mode_b, double b) {
  return SameMomentum(RoundMomentum{ToMode(mode_a), a},
                      RoundMomentum{ToMode(mode_b), b});
}

int GroupOfPy(const std::string& job_info_json, int rank) {
  absl::StatusOr<v1::JobInfo> job =
      FromJson<v1::JobInfo>(job_info_json, "JobInfo");
  ThrowIfError(job.status());
  absl::StatusOr<int> group = GroupOf(*job, rank);
  ThrowIfError(group.status());
  return *group;
}

// None for a rank that is not among the latest members.
std::optional<int64_t> MemberSincePy(const std::string& job_info_json,
                                     int rank) {
  absl::StatusOr<v1::JobInfo> job =
      FromJson<v1::JobInfo>(job_info_json, "JobInfo");
  ThrowIfError(job.status());
  if (rank >= 0 && rank < job->world_size() && !IsMember(*job, rank)) {
    return std::nullopt;
  }
  absl::StatusOr<int64_t> since = MemberSince(*job, rank);
  ThrowIfError(since.status());
  return *since;
}

DoubleArray InvStdPy(const DoubleArray& var, double eps) {
  std::vector<double> out(var.data(), var.data() + var.size());
  for (double& v : out) v = InvStd(v, eps);
  return ToArray(out);
}

}  // namespace

void BindRules(py::module_& m) {
  m.def("layer_spec_json", &LayerSpecJson, py::arg("options"), py::arg("name"),
        py::arg("channels") = 0,
        "The LayerSpec (JSON) of a layer, resolved like the C++ client "
        "(ToLayerSpec).");
  m.def("apply_round", &ApplyRoundPy, py::arg("mode"), py::arg("momentum"),
        py::arg("biased_var"), py::arg("track"), py::arg("count"),
        py::arg("mean"), py::arg("var"), py::arg("running_mean"),
        py::arg("running_var"), py::arg("num_batches_tracked"),
        py::arg("round_momentum") = py::none(),
        py::arg("imported") = py::none(),
        "One forward round's update of running statistics, the aggregator's "
        "rule (the layer's, or round_momentum (mode, value); from the "
        "running statistics given, or imported (num_batches_tracked, mean, "
        "var)): returns (running_mean, running_var, num_batches_tracked).");
  m.def("same_momentum", &SameMomentumPy, py::arg("mode_a"), py::arg("a"),
        py::arg("mode_b"), py::arg("b"),
        "Whether two (mode, momentum) move running statistics alike, bit for "
        "bit (kernels/round_update.h SameMomentum).");
  m.def("group_of", &GroupOfPy, py::arg("job_info_json"), py::arg("rank"),
        "The group of `rank` in a JobInfo (JSON): explicit rank lists or "
        "blocks of group_size (client/job_groups.h).");
  m.def("member_since", &MemberSincePy, py::arg("job_info_json"),
        py::arg("rank"),
        "The first step of `rank`'s current time as a member of the job "
        "(JobInfo JSON), None when it is not among the latest members "
        "(client/job_membership.h MemberSince).");
  m.def("inv_std", &InvStdPy, py::arg("var"), py::arg("eps"),
        "1 / sqrt(var + eps), float64.");
}

}  // namespace syncnorm::python
