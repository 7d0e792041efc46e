#include "server/rpc/read_flood.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "server/rpc/connection_guard.h"
#include "server/rpc/socket_closer.h"

namespace syncnorm {

ProcessMemory ReadProcessMemory() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return {};
  long long size = 0, resident = 0;
  const bool read = std::fscanf(f, "%lld %lld", &size, &resident) == 2;
  std::fclose(f);
  if (!read) return {};
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  return ProcessMemory{resident * page, size * page};
}

void ReadFloodBreaker::PassBegan() {
  bytes_at_start_ = sockets_->BytesReceived();
  grown_at_start_ = 0;
  allowance_ = kMaxExcess;
  closed_.clear();
}

void ReadFloodBreaker::PassGoesOn(int64_t grown) {
  // Memory the server gave back (its trim) is judged from the lower level.
  grown_at_start_ = std::min(grown_at_start_, grown);
  const int64_t excess = grown - grown_at_start_;
  if (excess < allowance_) return;
  absl::flat_hash_map<std::string, uint64_t> bytes_now =
      sockets_->BytesReceived();
  std::string busiest;
  uint64_t most = 0;
  for (const auto& [peer, bytes] : bytes_now) {
    if (closed_.contains(peer)) continue;  // its socket may linger a while
    const auto before = bytes_at_start_.find(peer);
    // A peer's count that went down is a new connection's.
    const uint64_t received =
        before == bytes_at_start_.end() || bytes < before->second
            ? bytes
            : bytes - before->second;
    if (received > most) {
      most = received;
      busiest = peer;
    }
  }
  if (busiest.empty() || excess - static_cast<int64_t>(most) < allowance_) {
    return;  // the memory holds what was read: a large message
  }
  guard_->Close(busiest, CloseReason::kReadFlood);
  closed_.insert(busiest);
  // The pass may go on with another flood (one that started while gRPC
  // still took this one's calls, or beside it): judged afresh from here,
  // on top of what this one left.
  bytes_at_start_ = std::move(bytes_now);
  grown_at_start_ = grown;
  allowance_ = std::max(allowance_ / 2, kMinExcess);
}

}  // namespace syncnorm
