// What a syncnorm binary's main does around serving: blocking the stop
// signals and publishing its bound port. Shared by the aggregator and the
// relay.
#ifndef SYNCNORM_SERVER_PROCESS_H_
#define SYNCNORM_SERVER_PROCESS_H_

#include <signal.h>

#include <string>

#include "absl/status/status.h"

namespace syncnorm {

// Blocks SIGTERM and SIGINT in the calling thread and every thread it
// starts afterwards (gRPC's included, which inherit the mask); the caller
// takes them with sigwait on the returned set. Call before any thread.
sigset_t BlockStopSignals();

// Writes `port` to `path` through a temporary file and a rename, so a reader
// never sees a partial number. INTERNAL naming the file on failure.
absl::Status WritePortFile(const std::string& path, int port);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_PROCESS_H_
