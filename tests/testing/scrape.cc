#include "tests/testing/scrape.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace syncnorm::testing {

int MetricsPortFromLog(const std::string& log_path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    std::ifstream in(log_path);
    std::stringstream s;
    s << in.rdbuf();
    const std::string log = s.str();
    const size_t start = log.find("event=start ");
    const size_t at = log.find("metrics_port=", start);
    if (start != std::string::npos && at != std::string::npos) {
      return std::atoi(log.c_str() + at + 13);
    }
    if (absl::Now() >= deadline) return 0;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    (void)!::write(fd, request.data(), request.size());
    char buffer[4096];
    for (ssize_t n; (n = ::read(fd, buffer, sizeof(buffer))) > 0;) {
      response.append(buffer, n);
    }
  }
  ::close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

std::string ScrapeMetrics(int port) { return HttpGet(port, "/metrics"); }

double HandledCalls(const std::string& text, const std::string& method,
                    const std::string& code) {
  const std::string with_method = absl::StrCat("grpc_method=\"", method, "\"");
  const std::string with_code = absl::StrCat("grpc_code=\"", code, "\"");
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, "grpc_server_handled_total{") ||
        !absl::StrContains(line, "grpc_service=\"syncnorm.v1.Aggregator\"") ||
        !absl::StrContains(line, with_method) ||
        (!code.empty() && !absl::StrContains(line, with_code))) {
      continue;
    }
    double value = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) {
      sum += value;
    }
  }
  return sum;
}

std::optional<double> Sample(const std::string& text,
                             const std::string& series) {
  const std::string prefix = series + " ";
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    double value = 0;
    if (absl::ConsumePrefix(&line, prefix) && absl::SimpleAtod(line, &value)) {
      return value;
    }
  }
  return std::nullopt;
}

}  // namespace syncnorm::testing
