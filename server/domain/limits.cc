#include "server/domain/limits.h"

#include <climits>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"

namespace syncnorm {

absl::Status LimitExceeded(absl::string_view what, absl::string_view flag,
                           int64_t limit, absl::string_view holder) {
  return absl::ResourceExhaustedError(
      absl::StrCat(what, " exceeds the ", holder, "'s limit --", flag, "=",
                   limit, " (the ", holder, "'s operator can raise it)"));
}

absl::Status CheckJobLimits(const JobSpec& spec, const Limits& limits) {
  if (limits.max_world_size > 0 && spec.world_size > limits.max_world_size) {
    return LimitExceeded(absl::StrCat("world_size ", spec.world_size),
                         "max_world_size", limits.max_world_size);
  }
  if (limits.max_layers_per_job > 0 &&
      spec.layers.size() > static_cast<size_t>(limits.max_layers_per_job)) {
    return LimitExceeded(absl::StrCat(spec.layers.size(), " layers"),
                         "max_layers_per_job", limits.max_layers_per_job);
  }
  if (limits.max_channels > 0) {
    for (size_t l = 0; l < spec.layers.size(); ++l) {
      if (spec.layers[l].channels > limits.max_channels) {
        return LimitExceeded(
            absl::StrCat("layer ", l, " with ", spec.layers[l].channels,
                         " channels (num_features)"),
            "max_channels", limits.max_channels);
      }
    }
  }
  if (limits.max_channels_per_job > 0) {
    int64_t channels = 0;
    for (const LayerConfig& layer : spec.layers) channels += layer.channels;
    channels *= spec.num_groups();
    if (channels > limits.max_channels_per_job) {
      return LimitExceeded(
          absl::StrCat(channels, " channels in all (num_features summed over ",
                       spec.layers.size(), " layers, times ", spec.num_groups(),
                       " groups)"),
          "max_channels_per_job", limits.max_channels_per_job);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMessageSize(size_t bytes, absl::string_view what,
                              int64_t max_message_bytes,
                              absl::string_view holder) {
  if (max_message_bytes <= 0 ||
      bytes <= static_cast<uint64_t>(max_message_bytes)) {
    return absl::OkStatus();
  }
  return LimitExceeded(absl::StrCat(what, " of ", bytes, " bytes"),
                       "max_message_bytes", max_message_bytes, holder);
}

int ReceiveCeiling(const Limits& limits) {
  if (limits.max_message_bytes <= 0) return -1;
  return limits.max_message_bytes >= INT_MAX / 2
             ? INT_MAX
             : static_cast<int>(limits.max_message_bytes * 2);
}

absl::Status CheckTransportBytes(int64_t max_transport_bytes,
                                 const Limits& limits) {
  const int ceiling = ReceiveCeiling(limits);
  if (max_transport_bytes <= 0 || ceiling < 0 ||
      max_transport_bytes >= ceiling) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--max_transport_bytes=", max_transport_bytes,
      " is below twice --max_message_bytes=", limits.max_message_bytes,
      " (gRPC's receive ceiling, ", ceiling,
      "): raise it, lower --max_message_bytes, or lift either with 0"));
}

RoundAdmission::Stripe& RoundAdmission::StripeOf(const Key& key) {
  return stripes_[absl::Hash<Key>()(key) % kStripes];
}

absl::Status RoundAdmission::Enter(const Key& key) {
  Stripe& stripe = StripeOf(key);
  absl::MutexLock lock(&stripe.mu);
  auto it = stripe.waiting.find(key);
  if (it != stripe.waiting.end()) {
    ++it->second;
    return absl::OkStatus();
  }
  if (draining_.load()) {
    return absl::UnavailableError(
        "the server is shutting down and starts no new rounds; retry "
        "against a running server (or this one once it is back)");
  }
  if (rounds_.fetch_add(1) >= max_rounds_ && max_rounds_ > 0) {
    rounds_.fetch_sub(1);
    return LimitExceeded("a new round: the rounds in flight on this server",
                         "max_pending_rounds", max_rounds_);
  }
  stripe.waiting.emplace(key, 1);
  return absl::OkStatus();
}

void RoundAdmission::Leave(const Key& key) {
  Stripe& stripe = StripeOf(key);
  absl::MutexLock lock(&stripe.mu);
  auto it = stripe.waiting.find(key);
  if (it == stripe.waiting.end()) return;
  if (--it->second == 0) {
    stripe.waiting.erase(it);
    rounds_.fetch_sub(1);
  }
}

bool RoundAdmission::AwaitIdle(absl::Time deadline) const {
  for (;;) {
    if (rounds_.load() == 0) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace syncnorm
