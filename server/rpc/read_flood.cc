#include "server/rpc/read_flood.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "server/rpc/connection_guard.h"
#include "server/rpc/socket_closer.h"

namespace syncnorm {

ProcessMemory ReadProcessMemory() {
  // open and read, not stdio: the watchdog reads it every 5 ms, and a
  // FILE's buffers would be heap allocated and freed at each read (held in
  // AddressSanitizer's quarantine, they grew the server by 4 MB a second).
  const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char text[128];
  const ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (n <= 0) return {};
  text[n] = '\0';
  char* end = nullptr;
  const long long size = std::strtoll(text, &end, 10);
  if (end == text) return {};
  char* rest = end;
  const long long resident = std::strtoll(rest, &end, 10);
  if (end == rest) return {};
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  return ProcessMemory{resident * page, size * page};
}

namespace {

// What was read from a connection's socket since `before` (by gRPC, or a
// close's discard), and what gRPC could take from it since then: what it
// sent since and what it held unread at `before`.
struct Since {
  int64_t read = 0;
  int64_t cost = 0;
};
Since BytesSince(
    const absl::flat_hash_map<std::string, SocketCloser::Bytes>& before,
    const std::string& peer, const SocketCloser::Bytes& now) {
  const auto it = before.find(peer);
  const auto received = static_cast<int64_t>(now.received);
  const auto unread = static_cast<int64_t>(now.unread);
  // A peer's count that went down is a new connection's. The unread count
  // is taken after the received one: bytes arriving between the two may
  // make it the larger.
  if (it == before.end() || now.received < it->second.received) {
    return Since{std::max<int64_t>(received - unread, 0), received};
  }
  const int64_t cost = received - static_cast<int64_t>(it->second.received) +
                       static_cast<int64_t>(it->second.unread);
  return Since{std::max<int64_t>(cost - unread, 0), cost};
}

}  // namespace

int64_t ReadFloodBreaker::Excess(int64_t growth, const Snapshot& since,
                                 const Snapshot& now, int64_t bytes_factor,
                                 const PeerSet* only) const {
  int64_t excess = growth;
  for (const auto& [peer, bytes] : now) {
    if (closed_.contains(peer) || (only != nullptr && !only->contains(peer))) {
      continue;
    }
    const int64_t read = BytesSince(since, peer, bytes).read;
    if (read > 0) excess -= bytes_factor * read + kPerConnection;
  }
  return excess;
}

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
  // The memory holds what was read.
  if (Excess(growth, at_start_, now, kPassBytesFactor, /*only=*/nullptr) <
      allowance_) {
    return;
  }
  const std::string costliest =
      Costliest(at_start_, now, /*min_cost=*/1, guard_->PeersGivingBack());
  if (costliest.empty()) return;  // every sender gives back
  guard_->Close(costliest, CloseReason::kReadFlood);
  closed_.insert(costliest);
  window_start_ = absl::InfinitePast();  // what the flood left is no one's
  // The pass may go on with another flood (one that started while gRPC
  // still took this one's calls, or beside it): judged afresh from here,
  // on top of what this one left.
  at_start_ = std::move(now);
  grown_at_start_ = grown;
  allowance_ = std::max(allowance_ / 2, kMinExcess);
}

void ReadFloodBreaker::Serving(absl::Time now, int64_t resident) {
  if (window_start_ == absl::InfinitePast()) {
    StartWindow(now, resident, sockets_->BytesReceived(),
                guard_->PeersGivingBack());
    closed_.clear();
    return;
  }
  window_floor_ = std::min(window_floor_, resident);
  const int64_t growth = resident - window_floor_;
  const bool over = now - window_start_ >= kWindow;
  // Judged once the memory grew by the allowance, and again at each
  // kMinExcess more (a flood goes on growing it; memory that stays, such
  // as a wide round's, is not counted again and again); and once a window
  // whether it goes on.
  const bool grew = growth >= std::max(kMaxExcess, judge_at_growth_) &&
                    now - judged_ >= judge_period_;
  if (!grew && !(over && now >= recheck_)) return;
  JudgeWindow(now, resident, growth, over);
}

void ReadFloodBreaker::JudgeWindow(absl::Time now, int64_t resident,
                                   int64_t growth, bool over) {
  judged_ = now;
  const absl::Time counting = absl::Now();
  Snapshot bytes = sockets_->BytesReceived();
  judge_period_ = kJudgeCostFactor * (absl::Now() - counting);
  // What a connection that gives back throughout the window sent was
  // answered and freed: a trainer's rounds would excuse any growth beside
  // them.
  const PeerSet giving_back = guard_->PeersGivingBack();
  for (const auto& entry : bytes) {
    if (!giving_back.contains(entry.first)) takers_.insert(entry.first);
  }
  const int64_t excess =
      Excess(growth, unanswered_since_, bytes, kServedBytesFactor, &takers_);
  if (excess >= kMaxExcess) {
    const std::string costliest =
        Costliest(window_bytes_, bytes, kMinCost, giving_back);
    if (!costliest.empty()) {
      guard_->Close(costliest, CloseReason::kReadFlood);
      closed_.clear();
      closed_.insert(costliest);  // its socket may linger
      // What the flood left is judged from here, from the sockets as the
      // close left them: what it discarded was read by no call.
      StartWindow(now, resident, sockets_->BytesReceived(), giving_back);
      return;
    }
  }
  judge_at_growth_ = growth + kMinExcess;
  // A window in which the memory grew past what was read goes on, so that
  // a flood slower than kMaxExcess a window is judged whole; up to
  // kLongestWindow, for memory the server keeps for reasons of its own.
  if (over &&
      (excess < kKeepWindowExcess || now - window_start_ >= kLongestWindow)) {
    closed_.clear();
    StartWindow(now, resident, std::move(bytes), giving_back);
  } else if (over) {
    recheck_ = now + kWindow;
  }
}

void ReadFloodBreaker::StartWindow(absl::Time now, int64_t resident,
                                   Snapshot bytes, const PeerSet& giving_back) {
  // A connection that does not give back may still hold all it read since
  // it last did: a round's answers come once its last rank has sent.
  Snapshot since;
  takers_.clear();
  for (const auto& [peer, b] : bytes) {
    if (giving_back.contains(peer) || closed_.contains(peer)) {
      since[peer] = b;  // its messages answered, or discarded
      continue;
    }
    takers_.insert(peer);
    const auto it = unanswered_since_.find(peer);
    if (it != unanswered_since_.end()) since[peer] = it->second;
  }
  unanswered_since_ = std::move(since);
  window_start_ = now;
  window_bytes_ = std::move(bytes);
  window_floor_ = resident;
  judge_at_growth_ = 0;
  recheck_ = absl::InfinitePast();
}

std::string ReadFloodBreaker::Costliest(const Snapshot& since,
                                        const Snapshot& now, int64_t min_cost,
                                        const PeerSet& giving_back) const {
  std::string costliest;
  int64_t most = min_cost - 1;
  for (const auto& [peer, bytes] : now) {
    // A closed connection's socket may linger a while.
    if (closed_.contains(peer) || giving_back.contains(peer)) continue;
    const int64_t cost = BytesSince(since, peer, bytes).cost;
    if (cost > most) {
      most = cost;
      costliest = peer;
    }
  }
  return costliest;
}

}  // namespace syncnorm
