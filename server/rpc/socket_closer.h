// Closing a client connection of the gRPC server from outside gRPC.
#ifndef SYNCNORM_SERVER_RPC_SOCKET_CLOSER_H_
#define SYNCNORM_SERVER_RPC_SOCKET_CLOSER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
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
  using BytesByPeer = absl::flat_hash_map<std::string, Bytes>;
  // Each connection's, by peer. The watchdog asks at every long pass. From
  // the process's descriptors (4 system calls a connection: a wide job's
  // 4,096 connections took 9% of the server's CPU so) while the last count
  // found fewer than kDumpFrom connections; from more, from a sock_diag
  // dump (netlink, as ss(8) reads them) of the TCP sockets of the network
  // namespace whose local port is the server's, a few calls for all of
  // them, unless netlink is refused. The dump walks every TCP socket of the
  // namespace, TIME_WAIT included: for a few connections beside thousands
  // of others' sockets (a shared host) the descriptors are cheaper.
  static constexpr size_t kDumpFrom = 256;
  BytesByPeer BytesReceived() const;
  // The two ways, for tests: nullopt when netlink is refused.
  std::optional<BytesByPeer> BytesReceivedFromSockDiag() const;
  BytesByPeer BytesReceivedFromDescriptors() const;

 private:
  // Calls `visit(fd, peer)` for each socket on the server's port until it
  // returns false.
  template <typename Visit>
  void ForEachSocket(Visit visit) const;

  const std::function<void()> closed_;
  std::atomic<int> port_{0};
  mutable std::atomic<size_t> last_count_{0};  // connections last counted
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_SOCKET_CLOSER_H_
