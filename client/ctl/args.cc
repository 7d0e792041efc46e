#include "client/ctl/args.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace syncnorm::ctl {
namespace {

// A usage error is told apart from the server's errors by this payload.
constexpr char kUsageUrl[] = "syncnormctl/usage";

struct Option {
  const char* name;
  bool takes_value;
};

constexpr Option kOptions[] = {
    {"server", true},   {"timeout", true},  {"group", true},
    {"step", true},     {"tag", true},      {"out", true},
    {"job", true},      {"output", true},   {"tls_ca", true},
    {"tls_cert", true}, {"tls_key", true},  {"token_file", true},
    {"tls", false},     {"replace", false}, {"help", false},
    {"version", false},
};

const Option* Find(absl::string_view name) {
  for (const Option& o : kOptions) {
    if (name == o.name) return &o;
  }
  return nullptr;
}

// "-o" and "-h", the short forms.
std::string LongName(absl::string_view shorthand) {
  if (shorthand == "o") return "output";
  if (shorthand == "h") return "help";
  return "";
}

// A number such as "-1" is a positional argument, not an option.
bool IsOption(absl::string_view a) {
  return a.size() > 1 && a[0] == '-' && !absl::ascii_isdigit(a[1]);
}

}  // namespace

std::string Args::Get(const std::string& name,
                      const std::string& fallback) const {
  auto it = options.find(name);
  return it == options.end() ? fallback : it->second;
}

absl::StatusOr<std::optional<int64_t>> Args::Int(
    const std::string& name) const {
  auto it = options.find(name);
  if (it == options.end()) return std::optional<int64_t>();
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return Usage(
        absl::StrCat("--", name, "=", it->second, " is not an integer"));
  }
  return std::optional<int64_t>(v);
}

absl::StatusOr<bool> Args::Json() const {
  const std::string format = Get("output", "table");
  if (format == "json") return true;
  if (format == "table") return false;
  return Usage(absl::StrCat("-o ", format,
                            ": the output format is table (the default) "
                            "or json"));
}

absl::StatusOr<Args> ParseArgs(int argc, const char* const* argv) {
  Args args;
  bool options_done = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (!options_done && a == "--") {
      options_done = true;
      continue;
    }
    if (options_done || !IsOption(a)) {
      if (args.command.empty()) {
        args.command = a;
      } else {
        args.positional.push_back(a);
      }
      continue;
    }
    // --name, --name=value, -o, -o=json, -ojson.
    const bool is_long = absl::StartsWith(a, "--");
    const absl::string_view body = absl::string_view(a).substr(is_long ? 2 : 1);
    std::string name;
    std::optional<std::string> value;
    if (is_long) {
      const size_t eq = body.find('=');
      name = std::string(body.substr(0, eq));
      if (eq != absl::string_view::npos)
        value = std::string(body.substr(eq + 1));
    } else {
      name = LongName(body.substr(0, 1));
      absl::string_view rest = body.substr(1);
      if (absl::ConsumePrefix(&rest, "=") || !rest.empty()) {
        value = std::string(rest);
      }
    }
    const Option* option = name.empty() ? nullptr : Find(name);
    if (option == nullptr) {
      return Usage(absl::StrCat("unknown option '", a, "'"));
    }
    if (option->takes_value) {
      if (!value.has_value()) {
        // "--tag --server=x" forgot the tag: an option is not a value
        // (--tag=--x gives one that looks like it).
        if (i + 1 >= argc || IsOption(argv[i + 1])) {
          return Usage(absl::StrCat(a, " needs a value: ", a, " VALUE or --",
                                    name, "=VALUE"));
        }
        value = argv[++i];
      }
      args.options[name] = *value;
      continue;
    }
    if (!value.has_value() || *value == "true") {
      args.options[name] = "";
    } else if (*value == "false") {
      args.options.erase(name);
    } else {
      return Usage(absl::StrCat("--", name,
                                " is a switch: give it alone (or "
                                "=true, =false), not '",
                                *value, "'"));
    }
  }
  return args;
}

absl::Status ExpectPositional(const Args& args, size_t min, size_t max,
                              absl::string_view shape) {
  if (args.positional.size() >= min && args.positional.size() <= max) {
    return absl::OkStatus();
  }
  return Usage(absl::StrCat("usage: syncnormctl ", args.command, " ", shape));
}

absl::StatusOr<std::vector<int>> ParseRanks(const Args& args, size_t first) {
  std::vector<int> ranks;
  for (size_t i = first; i < args.positional.size(); ++i) {
    const std::string& word = args.positional[i];
    int rank = -1;
    if (!absl::SimpleAtoi(word, &rank) || rank < 0) {
      return Usage(
          absl::StrCat("RANK '", word, "' is not a rank (an integer >= 0)"));
    }
    if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end()) {
      return Usage(absl::StrCat("rank ", rank, " is named twice"));
    }
    ranks.push_back(rank);
  }
  return ranks;
}

absl::Status Usage(absl::string_view what) {
  absl::Status s = absl::InvalidArgumentError(what);
  s.SetPayload(kUsageUrl, absl::Cord("1"));
  return s;
}

bool IsUsage(const absl::Status& status) {
  return status.GetPayload(kUsageUrl).has_value();
}

}  // namespace syncnorm::ctl
