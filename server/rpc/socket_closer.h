// Closing a client connection of the gRPC server from outside gRPC.
#ifndef SYNCNORM_SERVER_RPC_SOCKET_CLOSER_H_
#define SYNCNORM_SERVER_RPC_SOCKET_CLOSER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "server/rpc/connection_guard.h"

namespace syncnorm {

// Closes a TCP connection of the server by shutting its socket down (both
// ways): gRPC sees the connection end as if the peer had closed it, closes
// it and cancels its calls. gRPC's API has no way to close one connection,
// so the socket is found among the process's descriptors (/proc/self/fd):
// the one whose local port is the server's and whose peer address is
// `peer`. What the connection sent and gRPC has not read yet is dropped,
// so that gRPC does not go on parsing requests from a connection that is
// being closed. The descriptor stays gRPC's; only the connection ends.
// Thread-safe.
class SocketCloser final : public ConnectionCloser {
 public:
  // Matches nothing until set_server_port(). `closed`, if set, is called
  // after each connection it closes (the heap trimmer's cue that what the
  // connection held is no working set; server/memory_trimmer.h).
  explicit SocketCloser(std::function<void()> closed = nullptr)
      : closed_(std::move(closed)) {}
  void set_server_port(int port) { port_.store(port); }

  // `peer` as gRPC spells it: "ipv4:10.0.0.7:51234", "ipv6:[::1]:51234".
  bool Close(absl::string_view peer) override;

  // gRPC's spelling of the peer of socket `fd` on the server's port; "" if
  // it is not such a socket.
  std::string PeerOf(int fd) const;

  // What a connection on the server's port has received: all of it so far
  // (the kernel's count, TCP_INFO), and what of it gRPC has not read yet.
  struct Bytes {
    uint64_t received = 0;
    uint64_t unread = 0;
  };
  // Each connection's, by peer.
  absl::flat_hash_map<std::string, Bytes> BytesReceived() const;

 private:
  // Calls `visit(fd, peer)` for each socket on the server's port until it
  // returns false.
  template <typename Visit>
  void ForEachSocket(Visit visit) const;

  const std::function<void()> closed_;
  std::atomic<int> port_{0};
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_SOCKET_CLOSER_H_
