#include "server/rpc/socket_closer.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <linux/tcp.h>  // its tcp_info has the byte counts
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace syncnorm {
namespace {

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
  char text[INET6_ADDRSTRLEN] = {};
  if (remote.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(remote);
    inet_ntop(AF_INET, &a.sin_addr, text, sizeof(text));
    return absl::StrCat("ipv4:", text, ":", ntohs(a.sin_port));
  }
  const auto& a = reinterpret_cast<const sockaddr_in6&>(remote);
  // gRPC spells an IPv4 client of a dual-stack socket as IPv4.
  if (IN6_IS_ADDR_V4MAPPED(&a.sin6_addr)) {
    inet_ntop(AF_INET, &a.sin6_addr.s6_addr[12], text, sizeof(text));
    return absl::StrCat("ipv4:", text, ":", ntohs(a.sin6_port));
  }
  inet_ntop(AF_INET6, &a.sin6_addr, text, sizeof(text));
  return absl::StrCat("ipv6:[", text, "]:", ntohs(a.sin6_port));
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

absl::flat_hash_map<std::string, SocketCloser::Bytes>
SocketCloser::BytesReceived() const {
  absl::flat_hash_map<std::string, Bytes> bytes;
  ForEachSocket([&](int fd, const std::string& peer) {
    struct tcp_info info {};
    socklen_t len = sizeof(info);
    int unread = 0;
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
        len >= offsetof(struct tcp_info, tcpi_bytes_received) +
                   sizeof(info.tcpi_bytes_received) &&
        ::ioctl(fd, FIONREAD, &unread) == 0) {
      bytes[peer] = Bytes{info.tcpi_bytes_received,
                          static_cast<uint64_t>(std::max(unread, 0))};
    }
    return true;
  });
  return bytes;
}

}  // namespace syncnorm
