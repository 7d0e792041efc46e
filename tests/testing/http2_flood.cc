#include "tests/testing/http2_flood.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace syncnorm::testing {
namespace {

// Frame types and flags (RFC 9113, section 6).
constexpr uint8_t kData = 0x0, kHeaders = 0x1, kRstStream = 0x3,
                  kSettings = 0x4, kPing = 0x6, kGoaway = 0x7,
                  kWindowUpdate = 0x8;
constexpr uint8_t kEndStream = 0x1, kAck = 0x1, kEndHeaders = 0x4;
constexpr uint32_t kCancel = 0x8;
constexpr int64_t kInitialWindow = 65535;
constexpr size_t kFlushBytes = 16 << 10;

void PutFrameHeader(std::string& out, size_t length, uint8_t type,
                    uint8_t flags, uint32_t stream) {
  const char h[9] = {
      static_cast<char>(length >> 16), static_cast<char>(length >> 8),
      static_cast<char>(length),       static_cast<char>(type),
      static_cast<char>(flags),        static_cast<char>((stream >> 24) & 0x7f),
      static_cast<char>(stream >> 16), static_cast<char>(stream >> 8),
      static_cast<char>(stream)};
  out.append(h, sizeof(h));
}

// An HPACK string literal, not Huffman-coded (RFC 7541, 5.1 and 5.2).
void PutHpackString(std::string& out, const std::string& s) {
  size_t n = s.size();
  if (n < 127) {
    out.push_back(static_cast<char>(n));
  } else {
    out.push_back(static_cast<char>(127));
    for (n -= 127; n >= 128; n >>= 7) {
      out.push_back(static_cast<char>((n & 0x7f) | 0x80));
    }
    out.push_back(static_cast<char>(n));
  }
  out.append(s);
}

// The request's header fields.
std::vector<std::pair<std::string, std::string>> HeaderFields(
    const Http2FloodOptions& o) {
  std::vector<std::pair<std::string, std::string>> fields = {
      {":method", "POST"},
      {":scheme", "http"},
      {":path", o.path},
      {":authority", absl::StrCat("127.0.0.1:", o.port)},
      {"content-type", "application/grpc"},
      {"te", "trailers"}};
  fields.insert(fields.end(), o.metadata.begin(), o.metadata.end());
  return fields;
}

// A header block of literals, new names: without indexing (6.2.2), so that
// the decoder keeps no state of ours, or with incremental indexing (6.2.1)
// when `index` is set.
std::string HeaderBlock(const Http2FloodOptions& o, bool index) {
  std::string block;
  for (const auto& [name, value] : HeaderFields(o)) {
    block.push_back(index ? '\x40' : '\0');
    PutHpackString(block, name);
    PutHpackString(block, value);
  }
  return block;
}

// The fields HeaderBlock(o, true) put in the dynamic table, by index (6.1):
// the last one entered is 62, the first 62 + n - 1.
std::string IndexedHeaderBlock(const Http2FloodOptions& o) {
  const size_t n = HeaderFields(o).size();
  std::string block;
  for (size_t i = 0; i < n; ++i) {
    block.push_back(static_cast<char>(0x80 | (62 + n - 1 - i)));
  }
  return block;
}

uint32_t ReadU32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// One connection: the writer is FloodHttp2's thread, the reader a thread of
// its own that answers SETTINGS (when asked) and PINGs and tracks the
// connection's send window.
class Connection {
 public:
  Connection(int fd, const Http2FloodOptions& options)
      : fd_(fd), options_(options), reader_([this] { ReadLoop(); }) {}
  ~Connection() {
    ::shutdown(fd_, SHUT_RDWR);
    reader_.join();
    ::close(fd_);
  }

  // Sends `bytes`; false once the connection is gone.
  bool Send(const std::string& bytes) ABSL_LOCKS_EXCLUDED(write_mu_) {
    absl::MutexLock lock(&write_mu_);
    return SendLocked(bytes);
  }

  // Takes `n` bytes of the connection's send window, waiting until `deadline`
  // for the server to grant them; false on timeout or a closed connection.
  bool TakeWindow(int64_t n, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto ready = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return window_ >= n || result_.closed;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline) ||
        result_.closed) {
      return false;
    }
    window_ -= n;
    return true;
  }

  bool closed() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return result_.closed;
  }
  int64_t window() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return window_;
  }

  Http2FloodResult result() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return result_;
  }

 private:
  bool SendLocked(const std::string& bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) {
    const char* p = bytes.data();
    size_t n = bytes.size();
    while (n > 0) {
      const ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        // SO_SNDTIMEO: the server does not read; try again unless gone.
        if (closed()) return false;
        continue;
      }
      if (w <= 0) {
        MarkClosed();
        return false;
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }

  void MarkClosed() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    result_.closed = true;
  }

  void ReadLoop() {
    std::string buffer;
    char chunk[64 << 10];
    for (;;) {
      const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      buffer.append(chunk, static_cast<size_t>(n));
      size_t used = 0;
      while (buffer.size() - used >= 9) {
        const auto* h =
            reinterpret_cast<const unsigned char*>(buffer.data() + used);
        const size_t length = (size_t{h[0]} << 16) | (size_t{h[1]} << 8) | h[2];
        if (buffer.size() - used < 9 + length) break;
        OnFrame(h[3], h[4], ReadU32(h + 5) & 0x7fffffff, h + 9, length);
        used += 9 + length;
      }
      buffer.erase(0, used);
    }
    MarkClosed();
  }

  void OnFrame(uint8_t type, uint8_t flags, uint32_t stream,
               const unsigned char* payload, size_t length) {
    std::string reply;
    {
      absl::MutexLock lock(&mu_);
      switch (type) {
        case kHeaders:
          if (flags & kEndStream) ++result_.responses;
          break;
        case kRstStream:
          ++result_.resets;
          break;
        case kGoaway:
          result_.goaway = true;
          if (length > 8) {
            result_.goaway_debug.assign(
                reinterpret_cast<const char*>(payload) + 8, length - 8);
          }
          break;
        case kWindowUpdate:
          if (stream == 0 && length == 4) {
            window_ += ReadU32(payload) & 0x7fffffff;
          }
          break;
        case kSettings:
          if (!(flags & kAck) && options_.ack_settings) {
            PutFrameHeader(reply, 0, kSettings, kAck, 0);
          }
          break;
        case kPing:
          if (!(flags & kAck) && length == 8) {
            PutFrameHeader(reply, 8, kPing, kAck, 0);
            reply.append(reinterpret_cast<const char*>(payload), 8);
          }
          break;
        default:
          break;
      }
    }
    if (!reply.empty()) Send(reply);
  }

  const int fd_;
  const Http2FloodOptions& options_;
  absl::Mutex write_mu_;  // one writer of the socket at a time
  absl::Mutex mu_;
  int64_t window_ ABSL_GUARDED_BY(mu_) = kInitialWindow;
  Http2FloodResult result_ ABSL_GUARDED_BY(mu_);
  std::thread reader_;  // last: starts once the rest is built
};

}  // namespace

absl::StatusOr<Http2FloodResult> FloodHttp2(const Http2FloodOptions& options) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options.timeout;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options.port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("connect to 127.0.0.1:", options.port, ": ", error));
  }
  const timeval send_timeout{0, 200000};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout,
               sizeof(send_timeout));

  Connection connection(fd, options);
  std::string out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  PutFrameHeader(out, 0, kSettings, 0, 0);
  const std::string first_block = HeaderBlock(options, options.index_headers);
  const std::string block =
      options.index_headers ? IndexedHeaderBlock(options) : first_block;
  std::string data;
  const uint32_t size = static_cast<uint32_t>(options.message.size());
  data.push_back('\0');  // not compressed
  for (int shift : {24, 16, 8, 0})
    data.push_back(static_cast<char>(size >> shift));
  data.append(options.message);

  int sent = 0, queued = 0;
  for (int i = 0; i < options.requests && absl::Now() < deadline; ++i) {
    const uint32_t stream = 2 * static_cast<uint32_t>(i) + 1;
    const std::string& headers = i == 0 ? first_block : block;
    PutFrameHeader(out, headers.size(), kHeaders, kEndHeaders, stream);
    out.append(headers);
    if (connection.window() < static_cast<int64_t>(data.size())) {
      if (!connection.Send(out)) break;
      out.clear();
      sent = queued;
    }
    if (!connection.TakeWindow(static_cast<int64_t>(data.size()), deadline)) {
      break;
    }
    PutFrameHeader(out, data.size(), kData, kEndStream, stream);
    out.append(data);
    if (options.reset) {
      PutFrameHeader(out, 4, kRstStream, 0, stream);
      for (int shift : {24, 16, 8, 0}) {
        out.push_back(static_cast<char>(kCancel >> shift));
      }
    }
    ++queued;
    if (options.burst > 0 && queued % options.burst == 0) {
      if (!connection.Send(out)) break;
      out.clear();
      sent = queued;
      absl::SleepFor(options.pause);
    } else if (out.size() >= kFlushBytes) {
      if (!connection.Send(out)) break;
      out.clear();
      sent = queued;
    }
  }
  if (!out.empty() && connection.Send(out)) sent = queued;
  const absl::Duration took = absl::Now() - start;
  // The server holds what the flood left while the connection is open.
  const absl::Time hold_until = absl::Now() + options.hold_open;
  while (absl::Now() < hold_until && !connection.closed()) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  Http2FloodResult result = connection.result();
  result.sent = sent;
  result.took = took;
  return result;
}

}  // namespace syncnorm::testing
