#include "server/rpc/read_flood.h"

#include <unistd.h>

#include <cstdio>

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
  closed_ = false;
}

void ReadFloodBreaker::PassGoesOn(int64_t grown) {
  if (closed_ || grown < kMaxExcess) return;
  std::string busiest;
  uint64_t most = 0;
  for (const auto& [peer, bytes] : sockets_->BytesReceived()) {
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
  if (busiest.empty() || grown - static_cast<int64_t>(most) < kMaxExcess) {
    return;  // the memory holds what was read: a large message
  }
  closed_ = true;
  guard_->Close(busiest, CloseReason::kReadFlood);
}

}  // namespace syncnorm
