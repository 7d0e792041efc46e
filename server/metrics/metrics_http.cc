#include "server/metrics/metrics_http.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

namespace syncnorm {
namespace {

absl::Status CannotServe(const std::string& listen, absl::string_view why) {
  return absl::UnavailableError(absl::StrCat(
      "cannot serve metrics on --metrics_listen='", listen, "': ", why,
      "; check that it is HOST:PORT and that the port is free"));
}

// A listening socket bound to `listen`, or why not.
absl::StatusOr<int> Bind(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return CannotServe(listen, "no port");
  std::string host = listen.substr(0, colon);
  const std::string port = listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int error = ::getaddrinfo(host.empty() ? nullptr : host.c_str(),
                                  port.c_str(), &hints, &found);
  if (error != 0) return CannotServe(listen, ::gai_strerror(error));
  const int fd =
      ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  const bool bound =
      fd >= 0 &&
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
      ::bind(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      ::listen(fd, 128) == 0;
  const std::string why = std::strerror(errno);
  ::freeaddrinfo(found);
  if (!bound) {
    if (fd >= 0) ::close(fd);
    return CannotServe(listen, why);
  }
  return fd;
}

int PortOf(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return 0;
  }
  if (addr.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }
  return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
}

std::string Response(absl::string_view status, absl::string_view extra_headers,
                     absl::string_view content_type, absl::string_view body,
                     bool with_body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\n",
                      extra_headers, "Connection: close\r\n\r\n",
                      with_body ? body : "");
}

std::string PlainResponse(absl::string_view status, absl::string_view body,
                          absl::string_view extra_headers = "") {
  return Response(status, extra_headers, "text/plain; charset=utf-8",
                  absl::StrCat(body, "\n"), true);
}

}  // namespace

// The server's thread and everything it owns. Only that thread touches the
// connections.
class MetricsHttpServer::Loop {
 public:
  Loop(int listen_fd, int wake_fd, Render render, MetricsHttpOptions options)
      : listen_fd_(listen_fd),
        wake_fd_(wake_fd),
        render_(std::move(render)),
        options_(options) {}

  ~Loop() {
    for (const Connection& c : connections_) ::close(c.fd);
    ::close(listen_fd_);
    ::close(wake_fd_);
  }

  // Serves until Stop().
  void Run();

  void Stop() {
    stop_.store(true);
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }

 private:
  struct Connection {
    int fd = -1;
    absl::Time accepted;
    absl::Time deadline;  // of the request, then of the response
    std::string request;  // the head received so far
    std::string response;
    size_t written = 0;
    bool responding = false;
  };

  void AcceptAll(absl::Time now);
  // False once the connection is done with (answered, gone or broken).
  bool Read(Connection& c, absl::Time now);
  bool Write(Connection& c);
  std::string Answer(absl::string_view head);

  const int listen_fd_;
  const int wake_fd_;
  const Render render_;
  const MetricsHttpOptions options_;
  std::atomic<bool> stop_{false};
  std::vector<Connection> connections_;
};

void MetricsHttpServer::Loop::Run() {
  std::vector<pollfd> fds;
  while (!stop_.load()) {
    absl::Time now = absl::Now();
    absl::Time wake = now + absl::Seconds(1);
    fds.assign({{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}});
    for (const Connection& c : connections_) {
      fds.push_back(
          {c.fd, static_cast<short>(c.responding ? POLLOUT : POLLIN), 0});
      wake = std::min(wake, c.deadline);
    }
    const int64_t wait_ms =
        std::max<int64_t>(0, absl::ToInt64Milliseconds(wake - now) + 1);
    if (::poll(fds.data(), fds.size(), static_cast<int>(wait_ms)) < 0 &&
        errno != EINTR) {
      absl::SleepFor(absl::Milliseconds(10));  // nothing to do but retry
      continue;
    }
    now = absl::Now();
    // The connections polled, in poll order; accepted ones come after.
    std::vector<Connection> kept;
    kept.reserve(connections_.size());
    for (size_t i = 0; i < connections_.size(); ++i) {
      Connection& c = connections_[i];
      const short events = fds[i + 2].revents;
      bool open = true;
      if (events != 0) open = c.responding ? Write(c) : Read(c, now);
      if (open && now >= c.deadline) open = false;
      if (open) {
        kept.push_back(std::move(c));
      } else {
        ::close(c.fd);
      }
    }
    connections_ = std::move(kept);
    if (fds[1].revents != 0) AcceptAll(now);
  }
}

void MetricsHttpServer::Loop::AcceptAll(absl::Time now) {
  for (;;) {
    const int fd =
        ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // none left (EAGAIN), or an error to retry later
    if (connections_.size() >= static_cast<size_t>(options_.max_connections)) {
      // Make room: the oldest connection still to send its request.
      auto oldest = connections_.end();
      for (auto it = connections_.begin(); it != connections_.end(); ++it) {
        if (!it->responding &&
            (oldest == connections_.end() || it->accepted < oldest->accepted)) {
          oldest = it;
        }
      }
      if (oldest == connections_.end()) {
        ::close(fd);
        continue;
      }
      ::close(oldest->fd);
      connections_.erase(oldest);
    }
    Connection c;
    c.fd = fd;
    c.accepted = now;
    c.deadline = now + options_.request_timeout;
    connections_.push_back(std::move(c));
  }
}

bool MetricsHttpServer::Loop::Read(Connection& c, absl::Time now) {
  char buffer[4096];
  const ssize_t n = ::recv(c.fd, buffer, sizeof(buffer), 0);
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  if (n == 0) return false;  // the client left before its request was whole
  c.request.append(buffer, static_cast<size_t>(n));
  const size_t end = c.request.find("\r\n\r\n");
  if (end == std::string::npos &&
      c.request.size() <= options_.max_request_bytes) {
    return true;  // more to come, within the deadline
  }
  c.response =
      end == std::string::npos || end + 4 > options_.max_request_bytes
          ? PlainResponse("431 Request Header Fields Too Large",
                          absl::StrCat("the request head is over ",
                                       options_.max_request_bytes, " bytes"))
          : Answer(absl::string_view(c.request).substr(0, end));
  c.request.clear();
  c.responding = true;
  c.deadline = now + options_.request_timeout;
  return Write(c);
}

bool MetricsHttpServer::Loop::Write(Connection& c) {
  while (c.written < c.response.size()) {
    const ssize_t n = ::send(c.fd, c.response.data() + c.written,
                             c.response.size() - c.written, MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    c.written += static_cast<size_t>(n);
  }
  ::shutdown(c.fd, SHUT_WR);
  return false;
}

std::string MetricsHttpServer::Loop::Answer(absl::string_view head) {
  // "METHOD SP TARGET SP HTTP/x.y" on the first line.
  const absl::string_view line = head.substr(0, head.find("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = line.rfind(' ');
  if (sp1 == absl::string_view::npos || sp2 == sp1 ||
      !absl::StartsWith(line.substr(sp2 + 1), "HTTP/1.")) {
    return PlainResponse("400 Bad Request", "not an HTTP/1 request");
  }
  const absl::string_view method = line.substr(0, sp1);
  absl::string_view path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  if (method != "GET" && method != "HEAD") {
    return PlainResponse("405 Method Not Allowed",
                         "only GET and HEAD are served",
                         "Allow: GET, HEAD\r\n");
  }
  if (path != "/metrics") {
    return PlainResponse("404 Not Found", "the metrics are at /metrics");
  }
  return Response("200 OK", "", "text/plain; version=0.0.4; charset=utf-8",
                  render_(), method == "GET");
}

MetricsHttpServer::MetricsHttpServer(int port, std::unique_ptr<Loop> loop)
    : port_(port), loop_(std::move(loop)) {
  thread_ = std::thread([loop = loop_.get()] { loop->Run(); });
}

MetricsHttpServer::~MetricsHttpServer() {
  loop_->Stop();
  thread_.join();
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, Render render, MetricsHttpOptions options) {
  absl::StatusOr<int> fd = Bind(listen);
  if (!fd.ok()) return fd.status();
  const int wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake < 0) {
    ::close(*fd);
    return CannotServe(listen, std::strerror(errno));
  }
  const int port = PortOf(*fd);
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(
      port, std::make_unique<Loop>(*fd, wake, std::move(render), options)));
}

}  // namespace syncnorm
