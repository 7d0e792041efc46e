#include "server/stream_set.h"

#include <vector>

#include "server/limits.h"
#include "server/reduce_reactor.h"

namespace syncnorm {

absl::Status StreamSet::Add(ReduceReactor* stream) {
  absl::MutexLock lock(&mu_);
  if (closed_) {
    return absl::UnavailableError(
        "the server is shutting down; open the stream on a running server");
  }
  if (max_streams_ > 0 && open_.size() >= static_cast<size_t>(max_streams_)) {
    return LimitExceeded("a new Reduce stream: the open streams",
                         "max_streams", max_streams_);
  }
  open_.insert(stream);
  return absl::OkStatus();
}

void StreamSet::Remove(ReduceReactor* stream) {
  absl::MutexLock lock(&mu_);
  open_.erase(stream);
}

void StreamSet::CloseAll() {
  std::vector<ReduceReactor*> streams;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    for (ReduceReactor* s : open_) {
      s->Ref();  // kept alive until Close() returns
      streams.push_back(s);
    }
  }
  // Not under mu_: closing may end a stream inline, which removes it.
  for (ReduceReactor* s : streams) {
    s->Close();
    s->Unref();
  }
}

int StreamSet::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(open_.size());
}

}  // namespace syncnorm
