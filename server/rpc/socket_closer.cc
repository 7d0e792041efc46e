#include "server/rpc/socket_closer.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>  // rtattr
#include <linux/sock_diag.h>
#include <linux/tcp.h>  // its tcp_info has the byte counts
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace syncnorm {
namespace {

// The kernel's tcp_info may be shorter (an older kernel) or longer than
// this build's; from this length on it holds tcpi_bytes_received.
constexpr size_t kInfoWithBytesReceived =
    offsetof(tcp_info, tcpi_bytes_received) +
    sizeof(tcp_info::tcpi_bytes_received);

// The port of `addr` (IPv4 or IPv6).
int PortOf(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in&>(addr).sin_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in6&>(addr).sin6_port);
}

// Reads and drops what the kernel has received on `fd` and gRPC has not
// read yet: after a shutdown gRPC would still read and parse all of it
// (up to the receive buffer, megabytes of requests) before it sees the end.
// gRPC may be reading the socket at the same moment; it gets a cut frame
// or the end, either of which ends the connection.
void Discard(int fd) {
  constexpr size_t kMaxDiscard = 64 << 20;  // more than any receive buffer
  char buffer[64 << 10];
  for (size_t total = 0; total < kMaxDiscard;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n <= 0) return;
    total += static_cast<size_t>(n);
  }
}

// gRPC's spelling of a TCP peer: "ipv4:10.0.0.7:51234",
// "ipv6:[::1]:51234"; an IPv4 client of a dual-stack socket as IPv4.
std::string SpellPeer(int family, const void* address, int port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (family == AF_INET) {
    inet_ntop(AF_INET, address, text, sizeof(text));
    return absl::StrCat("ipv4:", text, ":", port);
  }
  const auto* a = static_cast<const in6_addr*>(address);
  if (IN6_IS_ADDR_V4MAPPED(a)) {
    inet_ntop(AF_INET, &a->s6_addr[12], text, sizeof(text));
    return absl::StrCat("ipv4:", text, ":", port);
  }
  inet_ntop(AF_INET6, a, text, sizeof(text));
  return absl::StrCat("ipv6:[", text, "]:", port);
}

// One sock_diag dump of `family`'s TCP sockets with a peer (every state
// but LISTEN and the ones past close) and local port `port`, held by a
// descriptor, into `out`; false if netlink refused or failed.
bool DumpSockets(int family, int port, SocketCloser::BytesByPeer& out) {
  const int fd =
      ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return false;
  // The watchdog never waits on a kernel that does not answer.
  const timeval timeout{0, 200 * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } message{};
  message.header.nlmsg_len = sizeof(message);
  message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  message.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  message.request.sdiag_family = static_cast<uint8_t>(family);
  message.request.sdiag_protocol = IPPROTO_TCP;
  // The kernel's TCP states (include/net/tcp_states.h, a stable ABI that
  // no user header spells beside linux/tcp.h): established 1, syn_recv 3,
  // fin_wait1 4, fin_wait2 5, close_wait 8, last_ack 9, closing 11.
  message.request.idiag_states = (1u << 1) | (1u << 3) | (1u << 4) | (1u << 5) |
                                 (1u << 8) | (1u << 9) | (1u << 11);
  message.request.idiag_ext = 1u << (INET_DIAG_INFO - 1);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(fd, &message, sizeof(message), 0,
               reinterpret_cast<sockaddr*>(&kernel),
               sizeof(kernel)) != static_cast<ssize_t>(sizeof(message))) {
    ::close(fd);
    return false;
  }
  // About 250 bytes a socket: 64 KiB holds a few hundred per read.
  alignas(nlmsghdr) static thread_local char buffer[64 << 10];
  bool ok = false;
  for (bool done = false; !done;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    int left = static_cast<int>(n);
    for (const nlmsghdr* h = reinterpret_cast<const nlmsghdr*>(buffer);
         NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_type == NLMSG_DONE) {
        done = ok = true;
        break;
      }
      if (h->nlmsg_type == NLMSG_ERROR) {
        done = true;
        break;
      }
      if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY) continue;
      const auto* socket = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
      // Inode 0: an orphan, closed by its process but not yet done with
      // its peer (FIN_WAIT2, LAST_ACK). No descriptor holds it, no gRPC
      // connection reads it, and its bytes are history.
      if (ntohs(socket->id.idiag_sport) != port || socket->idiag_inode == 0) {
        continue;
      }
      SocketCloser::Bytes bytes;
      bytes.unread = socket->idiag_rqueue;
      int attributes = static_cast<int>(h->nlmsg_len) -
                       static_cast<int>(NLMSG_LENGTH(sizeof(*socket)));
      for (const rtattr* a = reinterpret_cast<const rtattr*>(socket + 1);
           RTA_OK(a, attributes); a = RTA_NEXT(a, attributes)) {
        if (a->rta_type != INET_DIAG_INFO) continue;
        // The kernel's tcp_info may be shorter than ours, or longer.
        tcp_info info{};
        std::memcpy(&info, RTA_DATA(a),
                    std::min<size_t>(RTA_PAYLOAD(a), sizeof(info)));
        if (RTA_PAYLOAD(a) >= kInfoWithBytesReceived) {
          bytes.received = info.tcpi_bytes_received;
        }
      }
      out[SpellPeer(family, socket->id.idiag_dst,
                    ntohs(socket->id.idiag_dport))] = bytes;
    }
  }
  ::close(fd);
  return ok;
}

}  // namespace

std::string SocketCloser::PeerOf(int fd) const {
  sockaddr_storage local{}, remote{};
  socklen_t local_len = sizeof(local), remote_len = sizeof(remote);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
      (local.ss_family != AF_INET && local.ss_family != AF_INET6) ||
      PortOf(local) != port_.load() ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &remote_len) !=
          0) {
    return "";
  }
  if (remote.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(remote);
    return SpellPeer(AF_INET, &a.sin_addr, ntohs(a.sin_port));
  }
  const auto& a = reinterpret_cast<const sockaddr_in6&>(remote);
  return SpellPeer(AF_INET6, &a.sin6_addr, ntohs(a.sin6_port));
}

template <typename Visit>
void SocketCloser::ForEachSocket(Visit visit) const {
  if (port_.load() == 0) return;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    const std::string peer = PeerOf(static_cast<int>(fd));
    if (!peer.empty() && !visit(static_cast<int>(fd), peer)) break;
  }
  ::closedir(dir);
}

bool SocketCloser::Close(absl::string_view peer) {
  bool closed = false;
  ForEachSocket([&](int fd, const std::string& its_peer) {
    if (its_peer != peer) return true;
    closed = ::shutdown(fd, SHUT_RDWR) == 0;
    Discard(fd);
    return false;
  });
  if (closed && closed_) closed_();
  return closed;
}

SocketCloser::BytesByPeer SocketCloser::BytesReceived() const {
  if (last_count_.load(std::memory_order_relaxed) >= kDumpFrom) {
    if (std::optional<BytesByPeer> bytes = BytesReceivedFromSockDiag()) {
      last_count_.store(bytes->size(), std::memory_order_relaxed);
      return *std::move(bytes);
    }
  }
  BytesByPeer bytes = BytesReceivedFromDescriptors();
  last_count_.store(bytes.size(), std::memory_order_relaxed);
  return bytes;
}

std::optional<SocketCloser::BytesByPeer>
SocketCloser::BytesReceivedFromSockDiag() const {
  const int port = port_.load();
  BytesByPeer bytes;
  if (port == 0) return bytes;
  // An IPv4 client of a dual-stack listener is an AF_INET6 socket with a
  // mapped address; the AF_INET dump has the rest.
  if (!DumpSockets(AF_INET, port, bytes) ||
      !DumpSockets(AF_INET6, port, bytes)) {
    return std::nullopt;
  }
  return bytes;
}

SocketCloser::BytesByPeer SocketCloser::BytesReceivedFromDescriptors() const {
  BytesByPeer bytes;
  ForEachSocket([&](int fd, const std::string& peer) {
    struct tcp_info info {};
    socklen_t len = sizeof(info);
    int unread = 0;
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
        len >= kInfoWithBytesReceived && ::ioctl(fd, FIONREAD, &unread) == 0) {
      bytes[peer] = Bytes{info.tcpi_bytes_received,
                          static_cast<uint64_t>(std::max(unread, 0))};
    }
    return true;
  });
  return bytes;
}

}  // namespace syncnorm
