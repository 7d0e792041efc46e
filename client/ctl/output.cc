#include "client/ctl/output.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"

namespace syncnorm::ctl {

std::string ProtoJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  // Our own messages always print.
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  if (out.empty() || out.back() != '\n') out.push_back('\n');
  return out;
}

std::string JsonObject(
    const std::vector<std::pair<std::string, std::string>>& members) {
  std::string out = "{\n";
  for (size_t i = 0; i < members.size(); ++i) {
    std::string value = members[i].second;
    while (!value.empty() && value.back() == '\n') value.pop_back();
    absl::StrAppend(&out, " \"", members[i].first, "\": ", value,
                    i + 1 < members.size() ? ",\n" : "\n");
  }
  out += "}\n";
  return out;
}

std::string FormatUtc(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  const char* const units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, units[unit]);
}

std::string FormatRanks(const google::protobuf::RepeatedField<int32_t>& ranks) {
  std::vector<int> sorted(ranks.begin(), ranks.end());
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  return FormatRanks(RankSet::Of(sorted));
}

std::string FormatRanks(const RankSet& ranks) {
  std::vector<std::string> parts;
  for (const RankSet::Run& run : ranks.runs()) {
    if (int64_t{run.last} - run.first >= 2) {
      parts.push_back(absl::StrCat(run.first, "-", run.last));
      continue;
    }
    for (int r = run.first; r <= run.last; ++r) {
      parts.push_back(absl::StrCat(r));
    }
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, ",");
}

std::string JoinShards(const google::protobuf::RepeatedField<int32_t>& shards) {
  return absl::StrJoin(shards, ",");
}

}  // namespace syncnorm::ctl
