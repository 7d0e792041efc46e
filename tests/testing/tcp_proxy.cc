#include "tests/testing/tcp_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace syncnorm::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// Writes all of `n` bytes; false when the peer is gone.
bool WriteAll(int fd, const char* data, ssize_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= w;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpProxy>> TcpProxy::Start(int backend_port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr = Loopback(0);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, 64) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    return absl::InternalError(absl::StrCat("proxy listen: ", error));
  }
  std::unique_ptr<TcpProxy> proxy(
      new TcpProxy(fd, ntohs(addr.sin_port), backend_port));
  proxy->acceptor_ = std::thread([p = proxy.get()] { p->AcceptLoop(); });
  return proxy;
}

TcpProxy::~TcpProxy() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  ::shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  ::close(listen_fd_);
  DropAll();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* active) { return *active == 0; }, &active_));
}

int TcpProxy::DropAll() {
  absl::MutexLock lock(&mu_);
  // shutdown, not close: the pump owns the fds and closes them itself.
  for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
  // No pump owns a held connection's fd.
  for (int fd : silent_) ::close(fd);
  const int cut = static_cast<int>(open_.size() / 2 + silent_.size());
  silent_.clear();
  return cut;
}

void TcpProxy::HoldNew(bool hold) {
  absl::MutexLock lock(&mu_);
  hold_ = hold;
}

int TcpProxy::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

void TcpProxy::AcceptLoop() {
  while (true) {
    const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    {
      absl::MutexLock lock(&mu_);
      if (hold_ && !stopping_) {
        silent_.insert(client);
        ++held_;
        continue;
      }
    }
    const int backend = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = Loopback(backend_port_);
    if (backend < 0 || ::connect(backend, reinterpret_cast<sockaddr*>(&addr),
                                 sizeof(addr)) != 0) {
      if (backend >= 0) ::close(backend);
      ::close(client);  // the backend is down: so is the proxy, for now
      continue;
    }
    const int one = 1;
    ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(backend, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      ::close(client);
      ::close(backend);
      return;
    }
    open_.insert(client);
    open_.insert(backend);
    ++active_;
    std::thread([this, client, backend] { Pump(client, backend); }).detach();
  }
}

void TcpProxy::Pump(int client, int backend) {
  pollfd fds[2] = {{client, POLLIN, 0}, {backend, POLLIN, 0}};
  char buf[1 << 16];
  bool open = true;
  while (open) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2 && open; ++i) {
      if (fds[i].revents == 0) continue;
      const ssize_t n = ::recv(fds[i].fd, buf, sizeof(buf), 0);
      open = n > 0 && WriteAll(fds[1 - i].fd, buf, n);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    open_.erase(client);
    open_.erase(backend);
    ::close(client);
    ::close(backend);
    --active_;
  }
}

}  // namespace syncnorm::testing
