#include "client/shard_router.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace syncnorm {
namespace {

uint64_t Mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Shard lists stay small; a bigger range is a typo.
constexpr int kMaxShards = 4096;

// Appends `entry` to `out`, expanding a "{A..B}" range in it.
absl::Status Expand(absl::string_view entry, std::vector<std::string>& out) {
  const size_t open = entry.find('{');
  if (open == absl::string_view::npos) {
    if (entry.find('}') != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", entry, "' has '}' without '{'"));
    }
    out.emplace_back(entry);
    return absl::OkStatus();
  }
  const size_t close = entry.find('}', open);
  const absl::string_view prefix = entry.substr(0, open);
  const absl::string_view suffix =
      close == absl::string_view::npos ? "" : entry.substr(close + 1);
  std::vector<absl::string_view> bounds;
  if (close != absl::string_view::npos) {
    bounds = absl::StrSplit(entry.substr(open + 1, close - open - 1), "..");
  }
  int first = 0;
  int last = -1;
  if (bounds.size() != 2 || !absl::SimpleAtoi(bounds[0], &first) ||
      !absl::SimpleAtoi(bounds[1], &last) || first < 0 || last < first ||
      last - first >= kMaxShards ||
      suffix.find_first_of("{}") != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", entry,
        "' needs one range {A..B} with 0 <= A <= B, e.g. "
        "syncnorm-aggregator-{0..2}.syncnorm-aggregator.ns.svc:50051"));
  }
  for (int i = first; i <= last; ++i) {
    out.push_back(absl::StrCat(prefix, i, suffix));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseShardList(
    absl::string_view address) {
  std::vector<std::string> shards;
  for (absl::string_view entry : absl::StrSplit(address, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the aggregator address '", address,
                       "' has an empty entry; give host:port, or shards as "
                       "host0:port,host1:port,... in ordinal order"));
    }
    if (absl::Status s = Expand(entry, shards); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the aggregator address '", address, "': ", s.message()));
    }
  }
  if (static_cast<int>(shards.size()) > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("the aggregator address names ", shards.size(),
                     " shards; at most ", kMaxShards));
  }
  return shards;
}

uint64_t ShardKey(absl::string_view job_id, int layer) {
  uint64_t h = 0xcbf29ce484222325ULL;
  auto add = [&h](unsigned char byte) {
    h ^= byte;
    h *= 0x100000001b3ULL;
  };
  for (char c : job_id) add(static_cast<unsigned char>(c));
  const uint32_t l = static_cast<uint32_t>(layer);
  for (int i = 0; i < 4; ++i) add(static_cast<unsigned char>(l >> (8 * i)));
  return h;
}

uint64_t RendezvousScore(uint64_t key, int shard) {
  return Mix(key ^ Mix(static_cast<uint64_t>(shard)));
}

int ShardOf(absl::string_view job_id, int layer, int num_shards) {
  const uint64_t key = ShardKey(job_id, layer);
  int best = 0;
  uint64_t best_score = RendezvousScore(key, 0);
  for (int i = 1; i < num_shards; ++i) {
    const uint64_t score = RendezvousScore(key, i);
    if (score > best_score) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

std::vector<int> OwnedLayers(absl::string_view job_id, int num_layers,
                             int shard, int num_shards) {
  std::vector<int> owned;
  for (int l = 0; l < num_layers; ++l) {
    if (ShardOf(job_id, l, num_shards) == shard) owned.push_back(l);
  }
  return owned;
}

}  // namespace syncnorm
