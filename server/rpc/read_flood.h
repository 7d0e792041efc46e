// The flood defence that does not wait for the polling thread.
//
// gRPC 1.51's TCP endpoint reads a socket again, in the same pass, while
// the kernel holds more of it, and the transport parses each read at once:
// a client that keeps its socket full (an HTTP/2 rapid reset: requests sent
// and reset as fast as they can be written) keeps the polling thread in
// one pass over its connection, creating a call for every request. The
// server's one polling thread (RpcLoop) runs nothing else meanwhile, so
// ConnectionGuard, which judges connections by their calls, would judge
// that one only once the pass ends: after gRPC has taken all of its
// requests, tens of thousands of calls and hundreds of megabytes later.
// RpcLoop's watchdog sees such a pass from outside (the thread busy inside
// gRPC without handing the loop a single event) and tells a PassWatcher,
// with how much the process's memory grew meanwhile.
//
// A pass may also be long for a legitimate reason: one large message,
// which gRPC reads whole before the loop hears of it, or a wide round's
// first messages from thousands of connections. What tells a flood from
// them is what the memory grew by beyond the bytes gRPC read: a message
// costs a few times its own size, a flood's every request a call,
// kilobytes for a request of a hundred bytes (18-53 kB for 40-100 bytes:
// 180 times and more). The bytes that count are those gRPC read (the
// kernel's count of what arrived, less what still waits in the socket):
// a wide round's messages that reached their sockets while the thread was
// off the CPU are read in the pass that follows (issue 35), and a flood's
// requests that wait in its socket cost nothing until they are read.
// Which connection floods is told by what each costs without giving back,
// never by its useful traffic: a trainer whose large message arrives in
// the pass of a flood sent it more bytes in the pass than the flood did,
// whose bytes had all arrived before.
#ifndef SYNCNORM_SERVER_RPC_READ_FLOOD_H_
#define SYNCNORM_SERVER_RPC_READ_FLOOD_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "server/rpc/socket_closer.h"

namespace syncnorm {

class ConnectionGuard;

// The process's memory from /proc/self/statm, in bytes; both zero if it
// cannot be read. Cheap enough for the watchdog's every look.
struct ProcessMemory {
  int64_t resident = 0;
  int64_t virtual_size = 0;
};
ProcessMemory ReadProcessMemory();

// Told by RpcLoop's watchdog thread, and only on it, about long passes.
class PassWatcher {
 public:
  virtual ~PassWatcher() = default;
  // The loop's thread has been busy inside gRPC since the watchdog's last
  // look, without an event.
  virtual void PassBegan() = 0;
  // ... and still is, at each look after PassBegan; the process's resident
  // memory has grown by `grown` bytes since PassBegan.
  virtual void PassGoesOn(int64_t grown) = 0;
  // The loop's thread hands events (no pass) at this look; the process's
  // resident memory is `resident` bytes.
  virtual void Serving(absl::Time now, int64_t resident) = 0;
};

// Closes, for CloseReason::kReadFlood, the connection that costs the most
// without giving back, once the memory grew by kMaxExcess more than the
// messages read in the pass may hold: kPassBytesFactor times the bytes
// gRPC read from each connection in it, and kPerConnection for each it
// read from (its calls' bookkeeping). A connection's cost is what gRPC
// could take from it in the pass: what it had sent unread when the pass
// began and what it sent since. Only
// connections that do not give back are judged
// (ConnectionGuard::PeersGivingBack): one whose calls are answered is
// never closed here, however much it sends (a trainer's large messages);
// when none of those that sent anything is judged, nothing is closed and
// the guard's lines judge the calls once the loop counts them. Its calls
// end as the connection does. The pass may go on: gRPC drains the calls
// it had read from that connection only as fast as it reads the next
// flood, one beside it or after it. So from each close on the breaker
// judges afresh, with half the allowance of the close before (down to
// kMinExcess): the next connection goes once the memory has grown by that
// much beyond what was read since. Floods one after another in a pass then
// take about 2 x kMaxExcess for the first four, and kMinExcess plus what a
// flood sends between two of the watchdog's looks (about 6 MB) for each
// after those, instead of kMaxExcess each. A closed connection's bytes
// excuse nothing: what the close discards from its socket is read by no
// call.
//
// A flood need not keep the thread in one pass: one sent in bursts, or one
// that a loaded machine's scheduler lets the server read as it comes,
// leaves the thread events between its reads, and gRPC holds each of its
// requests (a stream waiting for the service, a call whose answer the
// client never reads) as a pass's flood would. So between passes the
// breaker judges the same way over a window: the memory's growth above
// its lowest since the window began, less what the messages of the
// connections that take in the window may hold: kServedBytesFactor times
// what gRPC read from each since it last gave back at a window's start
// (since it began, if it never did), and kPerConnection. A connection
// takes in a window if it does not give back at the window's start or at
// one of its judgments: a wide round's messages read in one window are
// parsed, copied and answered in the next, whose memory holds them and
// their answers though their ranks give back by then (issue 35). One that
// gives back throughout had its calls answered and their messages freed:
// a trainer sends hundreds of MB a window, which excuse nothing beside
// them, nor does what it sent before once the guard dropped its record.
// The costliest connection that does not give back goes once that excess
// passes kMaxExcess, provided it sent at least kMinCost in the window (a
// flood that grew the memory by kMaxExcess sent thousands of requests; a
// client's single call that makes the server allocate, CreateJob, sent
// less). A window lasts kWindow, longer (up to kLongestWindow) while the
// memory it holds beyond what was read is more than kKeepWindowExcess (a
// slow flood is judged whole), and ends at each close. A pass does not end
// it: a flood in bursts makes short passes, none long enough to judge. Not
// thread-safe: RpcLoop's watchdog only.
class ReadFloodBreaker final : public PassWatcher {
 public:
  // About 2,500 of a flood's calls; the server's other memory is bounded
  // by its limits (docs/operations.md).
  static constexpr int64_t kMaxExcess = int64_t{32} << 20;
  // The least allowance of a close after others in the same pass.
  static constexpr int64_t kMinExcess = int64_t{4} << 20;
  // What a connection's calls may hold beyond its bytes: gRPC keeps
  // 18-53 kB per call (tests/flood_test.cc), a client's connection starts
  // a few calls in a pass, a flood's thousands. A wide round (thousands
  // of connections, each with its first message) then takes no one's
  // connection.
  static constexpr int64_t kPerConnection = int64_t{128} << 10;
  // What a legitimate connection's messages may hold per byte gRPC read
  // from it, in a pass and between passes. In a pass gRPC only reads and
  // frames: a message holds the buffers it was read into (8 and 64 KiB
  // slices that its frames may fill in part) until the loop takes it.
  // Between passes the loop parses it, the domain keeps a copy until its
  // round completes, and its answer (as large, for Reduce) waits as a proto
  // and serialized until written: about five times its size, eight with
  // the allocator's slack. A flood's requests cost 180 times their bytes
  // and more: either factor lets a flood read in a pass or a window take
  // under 5% more requests before its close. Per byte read, not per byte
  // sent: a flood's bytes that wait unread in its socket excuse nothing.
  static constexpr int64_t kPassBytesFactor = 2;
  static constexpr int64_t kServedBytesFactor = 8;
  // Between passes: how long a window lasts, and the least a connection
  // must have sent in it to be closed.
  static constexpr absl::Duration kWindow = absl::Seconds(2);
  static constexpr absl::Duration kLongestWindow = absl::Seconds(30);
  static constexpr int64_t kMinCost = int64_t{64} << 10;
  // A window whose memory grew by this much past what was sent goes on.
  static constexpr int64_t kKeepWindowExcess = kMaxExcess / 8;
  // A window is judged once its memory grew by kMaxExcess, then at each
  // kMinExcess more, at most every kJudgeCostFactor times what its last
  // judgment took: each counts every socket's bytes (a few system calls a
  // connection; milliseconds at thousands of connections). With a few
  // connections that can be every look: a flood in bursts can make gRPC
  // hold 90 MB in 100 ms.
  static constexpr int kJudgeCostFactor = 10;

  // Both must outlive the breaker.
  ReadFloodBreaker(const SocketCloser* sockets, ConnectionGuard* guard)
      : sockets_(sockets), guard_(guard) {}

  void PassBegan() override;
  void PassGoesOn(int64_t grown) override;
  void Serving(absl::Time now, int64_t resident) override;

 private:
  using Snapshot = absl::flat_hash_map<std::string, SocketCloser::Bytes>;
  using PeerSet = absl::flat_hash_set<std::string>;
  // The connection in `now` with the highest cost since `since` that is
  // not in `giving_back`, was not closed in this pass and cost at least
  // `min_cost`; "" if none.
  std::string Costliest(const Snapshot& since, const Snapshot& now,
                        int64_t min_cost, const PeerSet& giving_back) const;
  // What the memory grew by beyond what the messages of the connections in
  // `now` (only those in `only`, if any; never those in closed_) may hold:
  // `bytes_factor` times what gRPC read from each since `since`, and
  // kPerConnection for each it read from.
  int64_t Excess(int64_t growth, const Snapshot& since, const Snapshot& now,
                 int64_t bytes_factor, const PeerSet* only) const;
  // The window's judgment, once its memory grew by `growth` or it is
  // `over`: closes the costliest connection if the excess passes
  // kMaxExcess, and starts the next window at a close or when it is over.
  void JudgeWindow(absl::Time now, int64_t resident, int64_t growth, bool over);
  // Starts a window with the sockets' `bytes` and the connections then
  // `giving_back`.
  void StartWindow(absl::Time now, int64_t resident, Snapshot bytes,
                   const PeerSet& giving_back);

  const SocketCloser* const sockets_;
  ConnectionGuard* const guard_;
  // Since the pass began, or since the last close in it.
  Snapshot at_start_;
  int64_t grown_at_start_ = 0;
  int64_t allowance_ = kMaxExcess;
  absl::flat_hash_set<std::string> closed_;  // in this pass or window

  // Between passes; the window starts again when window_start_ is
  // InfinitePast.
  absl::Time window_start_ = absl::InfinitePast();
  Snapshot window_bytes_;  // at its start
  // Each connection's bytes when it last gave back at a window's start, or
  // was closed; none if it never did (what it read since it began).
  Snapshot unanswered_since_;
  PeerSet takers_;            // in this window
  int64_t window_floor_ = 0;  // the least resident memory in it
  absl::Time judged_ = absl::InfinitePast();
  absl::Duration judge_period_ = absl::ZeroDuration();
  int64_t judge_at_growth_ = 0;  // the next judgment's growth, at least
  absl::Time recheck_ = absl::InfinitePast();  // whether the window goes on
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_READ_FLOOD_H_
