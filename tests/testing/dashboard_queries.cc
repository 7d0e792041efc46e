#include "tests/testing/dashboard_queries.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"

namespace syncnorm::testing {
namespace {

using nlohmann::json;

// (placeholder, value) of every variable, longest name first so that
// $pod never replaces the start of $pods.
std::vector<std::pair<std::string, std::string>> Replacements(
    const json& dashboard) {
  std::vector<std::pair<std::string, std::string>> values = {
      {"__rate_interval", "30s"}, {"__interval", "5s"}, {"__range", "5m"}};
  for (const json& v : dashboard["templating"]["list"]) {
    std::string value;
    if (v.value("includeAll", false) && v.contains("allValue")) {
      value = v["allValue"].get<std::string>();
    } else if (v.contains("current") && v["current"].contains("value") &&
               v["current"]["value"].is_string()) {
      value = v["current"]["value"].get<std::string>();
    }
    values.emplace_back(v["name"].get<std::string>(), value);
  }
  std::sort(values.begin(), values.end(), [](const auto& a, const auto& b) {
    return a.first.size() > b.first.size();
  });
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, value] : values) {
    out.emplace_back(absl::StrCat("${", name, "}"), value);
    out.emplace_back(absl::StrCat("$", name), value);
  }
  return out;
}

std::string Replace(
    std::string text,
    const std::vector<std::pair<std::string, std::string>>& replacements) {
  for (const auto& [from, to] : replacements) {
    text = absl::StrReplaceAll(text, {{from, to}});
  }
  return text;
}

}  // namespace

absl::StatusOr<std::vector<DashboardQuery>> DashboardQueries(
    absl::string_view dashboard_json) {
  const json dashboard = json::parse(dashboard_json, nullptr, false);
  if (dashboard.is_discarded() || !dashboard.contains("panels")) {
    return absl::InvalidArgumentError("not a dashboard's JSON");
  }
  const auto replacements = Replacements(dashboard);
  std::vector<DashboardQuery> out;
  std::vector<json> panels;
  for (const json& p : dashboard["panels"]) {
    panels.push_back(p);
    for (const json& nested : p.value("panels", json::array())) {
      panels.push_back(nested);
    }
  }
  for (const json& p : panels) {
    for (const json& t : p.value("targets", json::array())) {
      const std::string where = absl::StrCat("panel '", p.value("title", ""),
                                             "' ", t.value("refId", ""));
      if (!t.contains("expr") || !t["expr"].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(where, " has no expr"));
      }
      out.push_back(
          {where, Replace(t["expr"].get<std::string>(), replacements)});
    }
  }
  for (const json& v : dashboard["templating"]["list"]) {
    if (v.value("type", "") != "query") continue;
    const json& q = v["query"];
    const std::string query =
        q.is_string() ? q.get<std::string>() : q.value("query", "");
    const size_t open = query.find("label_values(");
    const size_t comma = query.rfind(',');
    if (open != 0 || comma == std::string::npos) continue;
    out.push_back({absl::StrCat("variable '", v.value("name", ""), "'"),
                   Replace(query.substr(13, comma - 13), replacements)});
  }
  return out;
}

}  // namespace syncnorm::testing
