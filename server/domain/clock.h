// The server's source of time, injectable so tests control deadlines.
#ifndef SYNCNORM_SERVER_DOMAIN_CLOCK_H_
#define SYNCNORM_SERVER_DOMAIN_CLOCK_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace syncnorm {

// Tells the current time. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The wall clock (absl::Now()).
class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_CLOCK_H_
