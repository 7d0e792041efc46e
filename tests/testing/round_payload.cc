#include "tests/testing/round_payload.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace syncnorm::testing {

Moments RoundPayload(const std::string& job, int layer, int64_t step, int rank,
                     int channels) {
  std::seed_seq seed{static_cast<uint64_t>(std::hash<std::string>()(job)),
                     static_cast<uint64_t>(layer), static_cast<uint64_t>(step),
                     static_cast<uint64_t>(rank)};
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.25, 2.0);
  Moments m = Moments::Zero(channels);
  m.count = 1 + static_cast<int64_t>(rng() % 8);
  for (int c = 0; c < channels; ++c) {
    m.mean[c] = 3.0 * normal(rng) + c;
    m.m2[c] = static_cast<double>(m.count - 1) * uniform(rng);
  }
  return m;
}

namespace {

// The FORWARD of (job, layer, step, rank) carrying `m`.
v1::Contribution ForwardOf(const std::string& job, int layer, int64_t step,
                           int rank, const Moments& m) {
  v1::Contribution c;
  c.set_job_id(job);
  c.set_layer(layer);
  c.set_step(step);
  c.set_phase(v1::FORWARD);
  c.set_rank(rank);
  c.mutable_moments()->set_count(m.count);
  for (double v : m.mean) c.mutable_moments()->add_mean(v);
  for (double v : m.m2) c.mutable_moments()->add_m2(v);
  return c;
}

}  // namespace

v1::Contribution RoundContribution(const std::string& job, int layer,
                                   int64_t step, int rank, int channels) {
  return ForwardOf(job, layer, step, rank,
                   RoundPayload(job, layer, step, rank, channels));
}

v1::Contribution SampledForward(
    const std::string& job, int64_t step, int rank,
    const std::vector<std::vector<double>>& samples) {
  Moments m;
  m.count = samples.empty() ? 0 : static_cast<int64_t>(samples[0].size());
  for (const std::vector<double>& x : samples) {
    double mean = 0;
    for (double v : x) mean += v;
    mean /= x.size();
    double m2 = 0;
    for (double v : x) m2 += (v - mean) * (v - mean);
    m.mean.push_back(mean);
    m.m2.push_back(m2);
  }
  return ForwardOf(job, /*layer=*/0, step, rank, m);
}

ReferenceMoments ReferenceMerge(const std::string& job, int layer, int64_t step,
                                const std::vector<int>& ranks, int channels) {
  std::vector<Moments> parts;
  ReferenceMoments r;
  for (int rank : ranks) {
    parts.push_back(RoundPayload(job, layer, step, rank, channels));
    r.count += parts.back().count;
  }
  r.mean.assign(channels, 0);
  r.m2.assign(channels, 0);
  for (int c = 0; c < channels; ++c) {
    long double sum = 0;
    for (const Moments& p : parts) sum += p.count * (long double)p.mean[c];
    r.mean[c] = r.count > 0 ? sum / r.count : 0;
    long double m2 = 0;
    for (const Moments& p : parts) {
      const long double d = (long double)p.mean[c] - r.mean[c];
      m2 += (long double)p.m2[c] + p.count * d * d;
    }
    r.m2[c] = m2;
  }
  return r;
}

namespace {

bool Near(long double got, long double want) {
  return std::fabs(got - want) <=
         1e-12L * std::max<long double>(1, std::fabs(want));
}

}  // namespace

std::string CheckGlobal(const v1::GlobalMoments& got,
                        const ReferenceMoments& want) {
  if (got.count() != want.count) {
    return absl::StrCat("count ", got.count(), " != ", want.count);
  }
  const int channels = static_cast<int>(want.mean.size());
  if (got.mean_size() != channels || got.var_size() != channels) {
    return absl::StrCat("channels ", got.mean_size(), "/", got.var_size(),
                        " != ", channels);
  }
  for (int c = 0; c < channels; ++c) {
    const long double var = want.count > 0 ? want.m2[c] / want.count : 0;
    if (!Near(got.mean(c), want.mean[c]) || !Near(got.var(c), var)) {
      return absl::StrCat("channel ", c, ": mean ", got.mean(c), " var ",
                          got.var(c), ", reference ", (double)want.mean[c], " ",
                          (double)var);
    }
  }
  return "";
}

namespace {

bool ParseEntry(const std::string& line, RoundLogEntry& e) {
  std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 6));
  if (f.size() < 5 || f[0].size() != 1) return false;
  e.kind = f[0][0];
  e.job = f[1];
  if (!absl::SimpleAtoi(f[2], &e.layer) || !absl::SimpleAtoi(f[3], &e.step)) {
    return false;
  }
  switch (e.kind) {
    case 'O':
      if (f.size() < 6 || !absl::SimpleAtoi(f[4], &e.version)) return false;
      if (f[5] != "-") {
        for (absl::string_view r : absl::StrSplit(f[5], ',')) {
          int rank = 0;
          if (!absl::SimpleAtoi(r, &rank)) return false;
          e.missing.push_back(rank);
        }
      }
      return true;
    case 'F':
      if (f.size() < 6 || !absl::SimpleAtoi(f[4], &e.code) ||
          !absl::SimpleAtoi(f[5], &e.elapsed_ms)) {
        return false;
      }
      e.text = f.size() > 6 ? f[6] : "";
      return true;
    case 'H':
      return absl::SimpleAtoi(f[4], &e.elapsed_ms);
    case 'B':
      e.text = line;
      return true;
    default:
      return false;
  }
}

}  // namespace

std::vector<RoundLogEntry> ReadRoundLogs(
    const std::vector<std::string>& paths) {
  std::vector<RoundLogEntry> out;
  for (const std::string& path : paths) {
    std::ifstream in(path);
    std::stringstream all;
    all << in.rdbuf();
    const std::string text = all.str();
    size_t start = 0;
    while (true) {
      const size_t end = text.find('\n', start);
      if (end == std::string::npos) break;  // a torn last line
      RoundLogEntry e;
      if (ParseEntry(text.substr(start, end - start), e)) out.push_back(e);
      start = end + 1;
    }
  }
  return out;
}

absl::StatusOr<std::map<std::string, JobRounds>> CollectRounds(
    const std::vector<RoundLogEntry>& entries) {
  std::map<std::string, JobRounds> jobs;
  for (const RoundLogEntry& e : entries) {
    if (e.kind != 'O') continue;
    auto& steps = jobs[e.job].completed[e.layer];
    auto [it, added] = steps.emplace(e.step, e.version);
    if (!added && it->second != e.version) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", e.job, " layer ", e.layer, " step ", e.step,
          " was reported with versions ", it->second, " and ", e.version));
    }
  }
  for (const auto& [job, rounds] : jobs) {
    for (const auto& [layer, steps] : rounds.completed) {
      std::set<int64_t> versions;
      int64_t last_version = 0;
      for (const auto& [step, version] : steps) {
        // Versions grow with steps, one per applied round.
        if (version <= last_version || !versions.insert(version).second) {
          return absl::FailedPreconditionError(absl::StrCat(
              "job ", job, " layer ", layer, " step ", step, " has version ",
              version, " after version ", last_version,
              ": an update was counted twice or out of order"));
        }
        last_version = version;
      }
      if (!versions.empty() &&
          *versions.rbegin() != static_cast<int64_t>(versions.size())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "job ", job, " layer ", layer, ": ", versions.size(),
            " completed rounds seen, but versions reach ", *versions.rbegin(),
            " (an update no worker saw, or one counted twice)"));
      }
    }
  }
  return jobs;
}

ReferenceRunning ReplayRunning(const std::string& job, int layer,
                               const std::map<int64_t, int64_t>& rounds,
                               int ranks, int channels) {
  std::map<int64_t, int64_t> by_version;
  for (const auto& [step, version] : rounds) by_version[version] = step;
  std::vector<int> all;
  for (int r = 0; r < ranks; ++r) all.push_back(r);
  ReferenceRunning out;
  out.mean.assign(channels, 0);
  out.var.assign(channels, 1);
  const long double m = 0.1L;
  for (const auto& [version, step] : by_version) {
    const ReferenceMoments g = ReferenceMerge(job, layer, step, all, channels);
    ++out.num_batches_tracked;
    for (int c = 0; c < channels; ++c) {
      out.mean[c] = (1 - m) * out.mean[c] + m * g.mean[c];
      out.var[c] = (1 - m) * out.var[c] + m * (g.m2[c] / (g.count - 1));
    }
  }
  return out;
}

}  // namespace syncnorm::testing
