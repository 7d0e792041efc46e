#include "client/relay_fallback.h"

#include <utility>

#include "absl/time/clock.h"
#include "client/contributor.h"
#include "client/shard_router.h"

namespace syncnorm {
namespace {

// The window of `step`, rounded down also for a negative step (which the
// shard refuses, but must not make two windows out of one).
int64_t WindowOf(int64_t step) {
  const int64_t n = RelayFallback::kStepsPerWindow;
  return step >= 0 ? step / n : -((-step + n - 1) / n);
}

}  // namespace

RelayFallback::RelayFallback(std::shared_ptr<grpc::Channel> relay,
                             std::vector<std::shared_ptr<grpc::Channel>> shards,
                             std::string job_id, int rank,
                             const ClientOptions& options,
                             const ClientClock* clock)
    : relay_(std::move(relay)),
      shards_(std::move(shards)),
      job_id_(std::move(job_id)),
      rank_(rank),
      options_(options),
      clock_(clock),
      contributors_(shards_.size()) {}

RelayFallback::~RelayFallback() {
  std::thread prober;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    prober = std::move(prober_);
  }
  if (prober.joinable()) prober.join();
}

void RelayFallback::Probe() {
  // Waits in short slices, so that the destructor need not wait long.
  constexpr absl::Duration kSlice = absl::Milliseconds(100);
  absl::MutexLock lock(&mu_);
  auto wanted = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || route_ == Route::kShards;
  };
  while (!stopping_) {
    mu_.Await(absl::Condition(&wanted));
    if (stopping_) break;
    mu_.Unlock();
    const grpc_connectivity_state state =
        relay_->GetState(/*try_to_connect=*/true);
    if (state == GRPC_CHANNEL_READY) {
      absl::SleepFor(kSlice);
    } else {
      relay_->WaitForStateChange(state,
                                 absl::ToChronoTime(absl::Now() + kSlice));
    }
    mu_.Lock();
  }
}

RelayFallback::Route RelayFallback::RouteOf(int64_t step) {
  absl::MutexLock lock(&mu_);
  if (route_ == Route::kRelay) return route_;
  const int64_t window = WindowOf(step);
  if (window == window_) return route_;
  window_ = window;
  if (route_ == Route::kProbation) {
    route_ = Route::kRelay;
  } else if (relay_->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) {
    // The prober keeps the channel connecting (an idle channel would not
    // try by itself), so it is READY here once the relay is back.
    route_ = Route::kProbation;
  }
  return route_;
}

void RelayFallback::RelayUnreachable(int64_t step) {
  absl::MutexLock lock(&mu_);
  route_ = Route::kShards;
  window_ = WindowOf(step);
  if (!prober_.joinable()) prober_ = std::thread([this] { Probe(); });
}

Contributor& RelayFallback::For(int layer) {
  const int shard = ShardOf(job_id_, layer, static_cast<int>(shards_.size()));
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Contributor>& c = contributors_[shard];
  if (c == nullptr) {
    c = std::make_unique<Contributor>(shards_[shard], job_id_, rank_, options_,
                                      clock_);
  }
  return *c;
}

absl::StatusOr<v1::RoundResult> RelayFallback::Round(const v1::Contribution& c,
                                                     absl::Time deadline) {
  return For(c.layer()).RoundUntil(c, deadline);
}

}  // namespace syncnorm
