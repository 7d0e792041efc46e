#include "client/ctl/state_dict.h"

#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/job_groups.h"
#include "nlohmann/json.hpp"

namespace syncnorm::ctl {
namespace {

using Json = nlohmann::ordered_json;

const char* const kMean = ".running_mean";
const char* const kVar = ".running_var";
const char* const kCount = ".num_batches_tracked";

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(std::string(what));
}

// A list of `n` numbers under `key`.
absl::StatusOr<std::vector<double>> Numbers(const Json& value,
                                            const std::string& key, int n) {
  if (!value.is_array() || static_cast<int>(value.size()) != n) {
    return Bad(absl::StrCat("'", key, "' must be a list of ", n,
                            " numbers (the layer's num_features)"));
  }
  std::vector<double> out;
  for (const Json& v : value) {
    if (!v.is_number()) {
      return Bad(
          absl::StrCat("'", key, "' holds a value that is not a number"));
    }
    out.push_back(v.get<double>());
  }
  return out;
}

// The entry of one layer, from the keys under its prefix.
absl::StatusOr<v1::LayerStats> LayerEntry(const Json& dict,
                                          const v1::LayerSpec& spec,
                                          const std::string& prefix) {
  const std::string mean_key = prefix + kMean, var_key = prefix + kVar,
                    count_key = prefix + kCount;
  if (!dict.contains(mean_key) || !dict.contains(var_key)) {
    return Bad(absl::StrCat("layer '", prefix, "' needs both '", mean_key,
                            "' and '", var_key, "'"));
  }
  auto mean = Numbers(dict[mean_key], mean_key, spec.num_features());
  if (!mean.ok()) return mean.status();
  auto var = Numbers(dict[var_key], var_key, spec.num_features());
  if (!var.ok()) return var.status();
  v1::LayerStats out;
  out.set_name(spec.name());
  out.mutable_running_mean()->Assign(mean->begin(), mean->end());
  out.mutable_running_var()->Assign(var->begin(), var->end());
  if (dict.contains(count_key)) {
    const Json& n = dict[count_key];
    if (!n.is_number_integer() || n.get<int64_t>() < 0) {
      return Bad(
          absl::StrCat("'", count_key, "' must be a non-negative integer"));
    }
    out.set_num_batches_tracked(n.get<int64_t>());
  }
  return out;
}

}  // namespace

std::string LayerPrefix(const v1::LayerSpec& spec, int index) {
  return spec.name().empty() ? absl::StrCat(index) : spec.name();
}

std::string ExportStateDict(const v1::JobInfo& job,
                            const v1::RunningStats& stats) {
  Json dict = Json::object();
  for (const v1::LayerStats& l : stats.layers()) {
    const std::string prefix = LayerPrefix(job.layers(l.layer()), l.layer());
    dict[prefix + kMean] =
        std::vector<double>(l.running_mean().begin(), l.running_mean().end());
    dict[prefix + kVar] =
        std::vector<double>(l.running_var().begin(), l.running_var().end());
    dict[prefix + kCount] = l.num_batches_tracked();
  }
  return dict.dump(2) + "\n";
}

absl::StatusOr<v1::SetRunningStatsRequest> ImportStateDict(
    const v1::JobInfo& job, const std::string& json, int group) {
  Json dict;
  try {
    dict = Json::parse(json);
  } catch (const Json::parse_error& e) {
    return Bad(absl::StrCat("the file is not valid JSON: ", e.what()));
  }
  if (!dict.is_object()) {
    return Bad("the file must hold one JSON object (a state_dict)");
  }
  std::map<std::string, int> layer_of;  // prefix -> index
  for (int i = 0; i < job.layers_size(); ++i) {
    layer_of[LayerPrefix(job.layers(i), i)] = i;
  }
  std::set<int> present;
  for (const auto& [key, value] : dict.items()) {
    const size_t dot = key.rfind('.');
    const std::string prefix =
        dot == std::string::npos ? key : key.substr(0, dot);
    const std::string suffix = dot == std::string::npos ? "" : key.substr(dot);
    auto it = layer_of.find(prefix);
    if (it == layer_of.end() ||
        (suffix != kMean && suffix != kVar && suffix != kCount)) {
      std::vector<std::string> names;
      for (const auto& [name, index] : layer_of) names.push_back(name);
      return Bad(absl::StrCat(
          "key '", key, "' matches no layer of job '", job.job_id(),
          "' (its layers: ", absl::StrJoin(names, ", "), ")"));
    }
    present.insert(it->second);
  }
  if (present.empty()) return Bad("the file holds no layer");
  const int groups = NumGroups(job);
  v1::SetRunningStatsRequest request;
  request.set_job_id(job.job_id());
  for (int layer : present) {
    auto entry = LayerEntry(dict, job.layers(layer),
                            LayerPrefix(job.layers(layer), layer));
    if (!entry.ok()) return entry.status();
    entry->set_layer(layer);
    for (int g = 0; g < groups; ++g) {
      if (group >= 0 && g != group) continue;
      v1::LayerStats* out = request.add_layers();
      *out = *entry;
      out->set_group(g);
    }
  }
  return request;
}

}  // namespace syncnorm::ctl
