// The metrics endpoint's HTTP server against clients that connect and say
// nothing, trickle their request a byte at a time, send too much, or ask
// for the wrong thing: each gets its answer or is closed at its deadline,
// and a scrape in their midst is answered at once.
#include "server/metrics/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace syncnorm {
namespace {

constexpr char kBody[] = "# TYPE up gauge\nup 1\n";

// A connected loopback socket; -1 if it could not connect.
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Everything the server sends on `fd` until it closes it, or until
// `timeout`, then closes `fd`.
std::string ReadAll(int fd, absl::Duration timeout) {
  const timeval tv = absl::ToTimeval(timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0;) {
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// Whether the server closes `fd` (without sending anything) within
// `timeout`; closes `fd`.
bool ClosedSilently(int fd, absl::Duration timeout) {
  const timeval tv = absl::ToTimeval(timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char c;
  const ssize_t n = ::recv(fd, &c, 1, 0);
  const bool closed = n == 0 || (n < 0 && errno == ECONNRESET);
  ::close(fd);
  return closed;
}

// The whole response to `request`, or "" if none came within `timeout`.
std::string Exchange(int port, const std::string& request,
                     absl::Duration timeout = absl::Seconds(5)) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  (void)!::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  return ReadAll(fd, timeout);
}

std::string Get(const std::string& path) {
  return absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: x\r\n\r\n");
}

std::unique_ptr<MetricsHttpServer> StartServer(MetricsHttpOptions options) {
  auto server = MetricsHttpServer::Start(
      "127.0.0.1:0", [] { return std::string(kBody); }, options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// Clients that send their request one byte every `period` and never finish
// it, from a thread each, until stopped.
class SlowLoris {
 public:
  SlowLoris(int port, int clients, absl::Duration period) {
    for (int i = 0; i < clients; ++i) {
      threads_.emplace_back([this, port, period] {
        const int fd = Connect(port);
        const std::string head = "GET /metrics HTTP/1.1\r\nX-Slow: ";
        for (size_t sent = 0; !stop_.load() && fd >= 0; ++sent) {
          const char c = sent < head.size() ? head[sent] : 'a';
          if (::send(fd, &c, 1, MSG_NOSIGNAL) != 1) {
            closed_.fetch_add(1);
            break;
          }
          absl::SleepFor(period);
        }
        if (fd >= 0) ::close(fd);
      });
    }
  }
  ~SlowLoris() {
    stop_.store(true);
    for (std::thread& t : threads_) t.join();
  }
  // Clients whose connection the server closed.
  int closed() const { return closed_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> closed_{0};
  std::vector<std::thread> threads_;
};

TEST(MetricsHttpTest, AnswersGetAndHeadOfMetricsAndRefusesTheRest) {
  auto server = StartServer({});
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const std::string ok = Exchange(port, Get("/metrics?x=1"));
  EXPECT_TRUE(absl::StartsWith(ok, "HTTP/1.1 200 OK\r\n")) << ok;
  EXPECT_TRUE(absl::StrContains(
      ok, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"))
      << ok;
  EXPECT_TRUE(absl::StrContains(
      ok, absl::StrCat("Content-Length: ", sizeof(kBody) - 1, "\r\n")))
      << ok;
  EXPECT_TRUE(absl::EndsWith(ok, absl::StrCat("\r\n\r\n", kBody))) << ok;
  const std::string head = Exchange(port, "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(head, "HTTP/1.1 200 OK\r\n")) << head;
  EXPECT_TRUE(absl::EndsWith(head, "\r\n\r\n")) << head;

  EXPECT_TRUE(
      absl::StartsWith(Exchange(port, Get("/")), "HTTP/1.1 404 Not Found\r\n"));
  const std::string post =
      Exchange(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(post, "HTTP/1.1 405 Method Not Allowed\r\n"))
      << post;
  EXPECT_TRUE(absl::StrContains(post, "Allow: GET, HEAD\r\n")) << post;
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "hello\r\n\r\n"),
                               "HTTP/1.1 400 Bad Request\r\n"));
}

TEST(MetricsHttpTest, AnOversizedRequestHeadIsRefused) {
  MetricsHttpOptions options;
  options.max_request_bytes = 1024;
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  const std::string big = absl::StrCat(
      "GET /metrics HTTP/1.1\r\nX-Big: ", std::string(4096, 'a'), "\r\n\r\n");
  const std::string response = Exchange(server->port(), big);
  EXPECT_TRUE(absl::StartsWith(
      response, "HTTP/1.1 431 Request Header Fields Too Large\r\n"))
      << response;
}

// Idle connections and slow-loris clients, more of them than the server
// keeps open: every scrape among them is answered at once, and the slow
// ones are closed at their deadline however they trickle.
TEST(MetricsHttpTest, IdleAndSlowClientsNeitherDelayScrapesNorStay) {
  MetricsHttpOptions options;
  options.request_timeout = absl::Milliseconds(600);
  options.max_connections = 16;
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  std::vector<int> idle;
  for (int i = 0; i < 40; ++i) idle.push_back(Connect(port));
  SlowLoris slow(port, 8, absl::Milliseconds(50));
  const std::string partial = "GET /metrics HTTP/1.1\r\nHost";
  for (int i = 0; i < 4; ++i) {
    const int fd = Connect(port);
    (void)!::send(fd, partial.data(), partial.size(), MSG_NOSIGNAL);
    idle.push_back(fd);
  }
  absl::SleepFor(absl::Milliseconds(100));
  for (int i = 0; i < 10; ++i) {
    const absl::Time start = absl::Now();
    const std::string response = Exchange(port, Get("/metrics"));
    EXPECT_TRUE(absl::EndsWith(response, kBody)) << "scrape " << i;
    EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "scrape " << i;
    absl::SleepFor(absl::Milliseconds(100));
  }
  // Every slow client was closed: at its deadline, or before, to make room.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (slow.closed() < 8 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(slow.closed(), 8);
  // And so was every idle one: the server sends nothing and closes.
  for (int fd : idle) EXPECT_TRUE(ClosedSilently(fd, absl::Seconds(5)));
}

TEST(MetricsHttpTest, ABusyPortIsUnavailableNamingTheFlag) {
  auto first = StartServer({});
  ASSERT_NE(first, nullptr);
  auto second = MetricsHttpServer::Start(
      absl::StrCat("127.0.0.1:", first->port()), [] { return ""; });
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(second.status().message(), "--metrics_listen"))
      << second.status();
  auto unresolvable =
      MetricsHttpServer::Start("no-such-host.invalid:0", [] { return ""; });
  EXPECT_EQ(unresolvable.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace syncnorm
