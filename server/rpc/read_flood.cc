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

namespace {

// What a connection sent since `before`, and what gRPC could take from it
// since then: that and what it held unread at `before`.
struct Since {
  int64_t sent = 0;
  int64_t cost = 0;
};
Since BytesSince(
    const absl::flat_hash_map<std::string, SocketCloser::Bytes>& before,
    const std::string& peer, const SocketCloser::Bytes& now) {
  const auto it = before.find(peer);
  // A peer's count that went down is a new connection's.
  if (it == before.end() || now.received < it->second.received) {
    return Since{static_cast<int64_t>(now.received),
                 static_cast<int64_t>(now.received)};
  }
  const auto sent = static_cast<int64_t>(now.received - it->second.received);
  return Since{sent, sent + static_cast<int64_t>(it->second.unread)};
}

}  // namespace

void ReadFloodBreaker::PassBegan() {
  at_start_ = sockets_->BytesReceived();
  grown_at_start_ = 0;
  allowance_ = kMaxExcess;
  closed_.clear();
}

void ReadFloodBreaker::PassGoesOn(int64_t grown) {
  // Memory the server gave back (its trim) is judged from the lower level.
  grown_at_start_ = std::min(grown_at_start_, grown);
  const int64_t growth = grown - grown_at_start_;
  if (growth < allowance_) return;
  Snapshot now = sockets_->BytesReceived();
  int64_t excess = growth;
  for (const auto& [peer, bytes] : now) {
    const int64_t sent = BytesSince(at_start_, peer, bytes).sent;
    if (sent > 0) excess -= sent + kPerConnection;
  }
  if (excess < allowance_) return;  // the memory holds what was sent
  const std::string costliest = Costliest(now);
  if (costliest.empty()) return;  // every sender gives back
  guard_->Close(costliest, CloseReason::kReadFlood);
  closed_.insert(costliest);
  // The pass may go on with another flood (one that started while gRPC
  // still took this one's calls, or beside it): judged afresh from here,
  // on top of what this one left.
  at_start_ = std::move(now);
  grown_at_start_ = grown;
  allowance_ = std::max(allowance_ / 2, kMinExcess);
}

std::string ReadFloodBreaker::Costliest(const Snapshot& now) const {
  const absl::flat_hash_set<std::string> giving_back =
      guard_->PeersGivingBack();
  std::string costliest;
  int64_t most = 0;
  for (const auto& [peer, bytes] : now) {
    // A closed connection's socket may linger a while.
    if (closed_.contains(peer) || giving_back.contains(peer)) continue;
    const int64_t cost = BytesSince(at_start_, peer, bytes).cost;
    if (cost > most) {
      most = cost;
      costliest = peer;
    }
  }
  return costliest;
}

}  // namespace syncnorm
