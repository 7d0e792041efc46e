// A unary call through a generic gRPC stub, retried while the server is
// down (killed and restarting on the same port).
#ifndef SYNCNORM_TESTS_TESTING_RETRY_H_
#define SYNCNORM_TESTS_TESTING_RETRY_H_

#include <grpcpp/grpcpp.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace syncnorm::testing {

// Calls `call(&context)` with a fresh context (a 20 s deadline) until it
// returns anything but UNAVAILABLE or DEADLINE_EXCEEDED, or `total` has
// passed; returns the last status. The server's own errors come back at
// once.
template <typename Call>
grpc::Status RetryWhileDown(Call call,
                            absl::Duration total = absl::Minutes(1)) {
  const absl::Time deadline = absl::Now() + total;
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    grpc::Status s = call(&context);
    if (s.ok() || absl::Now() > deadline ||
        (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
         s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED)) {
      return s;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_RETRY_H_
