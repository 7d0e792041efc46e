// The ConnectionGuard's lines, each crossed by one call more, with a fake
// closer; the SocketCloser on real loopback sockets; and the
// ReadFloodBreaker, on loopback sockets, with a fake closer.
#include "server/rpc/connection_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "server/domain/fake_clock.h"
#include "server/rpc/read_flood.h"
#include "server/rpc/socket_closer.h"

namespace syncnorm {
namespace {

class RecordingCloser final : public ConnectionCloser {
 public:
  bool Close(absl::string_view peer) override {
    absl::MutexLock lock(&mu_);
    closed_.emplace_back(peer);
    return true;
  }
  std::vector<std::string> closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> closed_ ABSL_GUARDED_BY(mu_);
};

constexpr char kPeer[] = "ipv4:10.0.0.7:51234";
constexpr char kOther[] = "ipv6:[2001:db8::1]:40000";

class ConnectionGuardTest : public ::testing::Test {
 protected:
  void Make(ConnectionGuardOptions options) {
    guard_ = std::make_unique<ConnectionGuard>(options, &closer_, &clock_);
  }
  // One call from `peer` that ends with `code` after `lifetime`.
  void Call(const std::string& peer, absl::StatusCode code,
            absl::Duration lifetime = absl::Milliseconds(1)) {
    auto c = guard_->CallStarted(peer);
    ASSERT_NE(c, nullptr);
    guard_->CallEnded(*c, code, lifetime);
  }
  RecordingCloser closer_;
  FakeClock clock_;
  std::unique_ptr<ConnectionGuard> guard_;
};

// HTTP/2 rapid reset: calls cancelled as they were sent. The line is 128
// of them and more than half of the connection's calls.
TEST_F(ConnectionGuardTest, ClosesAConnectionThatCancelsMostOfItsCalls) {
  Make({});
  for (int i = 0; i < 127; ++i) Call(kPeer, absl::StatusCode::kCancelled);
  EXPECT_TRUE(closer_.closed().empty());
  Call(kPeer, absl::StatusCode::kCancelled);
  EXPECT_EQ(closer_.closed(), std::vector<std::string>{kPeer});
  EXPECT_EQ(guard_->closed(CloseReason::kRapidReset), 1);
  // Once: its calls still ending do not close it again.
  for (int i = 0; i < 10; ++i) Call(kPeer, absl::StatusCode::kCancelled);
  EXPECT_EQ(closer_.closed().size(), 1u);

  // A new connection from the same address and port, seconds later, is
  // judged afresh.
  clock_.Advance(absl::Seconds(5));
  for (int i = 0; i < 127; ++i) Call(kPeer, absl::StatusCode::kCancelled);
  EXPECT_EQ(closer_.closed().size(), 1u);
  Call(kPeer, absl::StatusCode::kCancelled);
  EXPECT_EQ(closer_.closed().size(), 2u);
  EXPECT_EQ(guard_->closed(CloseReason::kRapidReset), 2);

  // A busy client that cancels some of its calls keeps its connection.
  for (int i = 0; i < 300; ++i) Call(kOther, absl::StatusCode::kOk);
  for (int i = 0; i < 150; ++i) Call(kOther, absl::StatusCode::kCancelled);
  EXPECT_EQ(closer_.closed().size(), 2u);
  // Streams cancelled late (a broken connection ends its long-lived
  // streams) are not a flood.
  for (int i = 0; i < 500; ++i) {
    Call("ipv4:10.0.0.8:2", absl::StatusCode::kCancelled, absl::Seconds(2));
  }
  EXPECT_EQ(closer_.closed().size(), 2u);
  // Deadlines are the client's own doing, not a flood.
  for (int i = 0; i < 500; ++i) {
    Call("ipv4:10.0.0.8:1", absl::StatusCode::kDeadlineExceeded);
  }
  EXPECT_EQ(closer_.closed().size(), 2u);
}

// While the server holds more calls than max_calls, a connection that
// starts more than overload_calls of them is closed; the others, and any
// connection once the overload is over, are not.
TEST_F(ConnectionGuardTest, ClosesTheConnectionThatFloodsAnOverloadedServer) {
  ConnectionGuardOptions options;
  options.max_calls = 100;
  options.overload_calls = 50;
  Make(options);
  for (int i = 0; i < 101; ++i) guard_->CallArrived();
  std::vector<std::shared_ptr<ConnectionGuard::Connection>> open;
  for (int i = 0; i < 50; ++i) open.push_back(guard_->CallStarted(kPeer));
  for (int i = 0; i < 10; ++i) open.push_back(guard_->CallStarted(kOther));
  EXPECT_TRUE(closer_.closed().empty());
  open.push_back(guard_->CallStarted(kPeer));
  EXPECT_EQ(closer_.closed(), std::vector<std::string>{kPeer});
  EXPECT_EQ(guard_->closed(CloseReason::kOverload), 1);

  // Not overloaded: kOther's count starts again.
  guard_->CallReleased();
  for (int i = 0; i < 100; ++i) open.push_back(guard_->CallStarted(kOther));
  EXPECT_EQ(closer_.closed().size(), 1u);
  for (auto& c : open)
    guard_->CallEnded(*c, absl::StatusCode::kOk, absl::Seconds(1));
  EXPECT_EQ(guard_->calls_held(), 100);
}

TEST_F(ConnectionGuardTest, ClosesAConnectionWithManyUnauthenticatedCalls) {
  Make({});
  for (int i = 0; i < 63; ++i) Call(kPeer, absl::StatusCode::kUnauthenticated);
  for (int i = 0; i < 100; ++i) Call(kPeer, absl::StatusCode::kOk);
  EXPECT_TRUE(closer_.closed().empty());
  Call(kPeer, absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(closer_.closed(), std::vector<std::string>{kPeer});
  EXPECT_EQ(guard_->closed(CloseReason::kUnauthenticated), 1);
}

// Calls refused UNIMPLEMENTED (a relay asked what only a shard serves)
// give nothing back, however quickly they were refused: 64 of them close
// the connection, and until then they count against its answered calls.
TEST_F(ConnectionGuardTest, ClosesAConnectionWithManyUnimplementedCalls) {
  Make({});
  for (int i = 0; i < 10; ++i) Call(kPeer, absl::StatusCode::kOk);
  for (int i = 0; i < 10; ++i) {
    Call(kPeer, absl::StatusCode::kUnimplemented);
  }
  EXPECT_FALSE(guard_->PeersGivingBack().contains(kPeer))
      << "10 answered, 10 refused";
  for (int i = 0; i < 53; ++i) {
    Call(kPeer, absl::StatusCode::kUnimplemented);
  }
  EXPECT_TRUE(closer_.closed().empty());
  Call(kPeer, absl::StatusCode::kUnimplemented);
  EXPECT_EQ(closer_.closed(), std::vector<std::string>{kPeer});
  EXPECT_EQ(guard_->closed(CloseReason::kUnimplemented), 1);
  EXPECT_EQ(guard_->closed(CloseReason::kUnauthenticated), 0);
  EXPECT_EQ(std::string(CloseReasonName(CloseReason::kUnimplemented)),
            "unimplemented");
}

// Unix-socket peers are not told apart: not judged.
TEST_F(ConnectionGuardTest, JudgesTcpPeersOnly) {
  Make({});
  EXPECT_EQ(guard_->CallStarted("unix:"), nullptr);
  EXPECT_EQ(guard_->CallStarted("unix:/run/s.sock"), nullptr);
  EXPECT_EQ(guard_->tracked(), 0);
}

// A record outlives its connection's last call by a minute, then goes.
TEST_F(ConnectionGuardTest, ForgetsConnectionsIdleForAMinute) {
  Make({});
  for (int i = 0; i < 100; ++i) Call(kPeer, absl::StatusCode::kCancelled);
  auto open = guard_->CallStarted(kOther);
  clock_.Advance(absl::Seconds(30));
  Call("ipv4:10.0.0.9:1", absl::StatusCode::kOk);
  EXPECT_EQ(guard_->tracked(), 3);
  clock_.Advance(absl::Seconds(31));
  Call("ipv4:10.0.0.9:1", absl::StatusCode::kOk);
  EXPECT_EQ(guard_->tracked(), 2) << "kPeer forgotten, kOther has a call";
  // kPeer starts from nothing: 100 more cancels are not yet 128.
  for (int i = 0; i < 100; ++i) Call(kPeer, absl::StatusCode::kCancelled);
  EXPECT_TRUE(closer_.closed().empty());
  guard_->CallEnded(*open, absl::StatusCode::kOk, absl::Seconds(1));
}

// Giving back: answered calls (or a stream's answers) outnumber the calls
// refused, cancelled early and still in progress. A trainer's stream with
// its answers gives back; a flood whose first calls were answered but that
// holds more in progress (answers its client does not read) does not.
TEST_F(ConnectionGuardTest, GivingBackCountsStreamedAnswersAndHeldCalls) {
  Make({});
  auto stream = guard_->CallStarted(kPeer);
  ASSERT_NE(stream, nullptr);
  guard_->MessageAnswered(*stream);
  EXPECT_FALSE(guard_->PeersGivingBack().contains(kPeer))
      << "one answer, one call in progress";
  guard_->MessageAnswered(*stream);
  EXPECT_TRUE(guard_->PeersGivingBack().contains(kPeer));

  for (int i = 0; i < 10; ++i) Call(kOther, absl::StatusCode::kNotFound);
  EXPECT_TRUE(guard_->PeersGivingBack().contains(kOther));
  std::vector<std::shared_ptr<ConnectionGuard::Connection>> held;
  for (int i = 0; i < 10; ++i) held.push_back(guard_->CallStarted(kOther));
  EXPECT_FALSE(guard_->PeersGivingBack().contains(kOther))
      << "10 answered, 10 held";
  for (auto& c : held)
    guard_->CallEnded(*c, absl::StatusCode::kOk, absl::Milliseconds(1));
  EXPECT_TRUE(guard_->PeersGivingBack().contains(kOther));
  guard_->CallEnded(*stream, absl::StatusCode::kOk, absl::Seconds(1));
}

// A listening socket of "the server" on loopback, and connections to it.
class Loopback {
 public:
  Loopback() {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    addr_.sin_family = AF_INET;
    addr_.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr_);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&addr_), len), 0);
    EXPECT_EQ(::listen(listener_, 4), 0);
    EXPECT_EQ(
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr_), &len), 0);
  }
  ~Loopback() {
    for (int fd : fds_) ::close(fd);
    ::close(listener_);
  }
  int port() const { return ntohs(addr_.sin_port); }

  struct Connection {
    int client = -1;
    int accepted = -1;  // the server's side
    std::string peer;   // the client, as gRPC spells it
  };
  Connection Connect() {
    Connection c;
    c.client = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(::connect(c.client, reinterpret_cast<const sockaddr*>(&addr_),
                        sizeof(addr_)),
              0);
    c.accepted = ::accept(listener_, nullptr, nullptr);
    EXPECT_GE(c.accepted, 0);
    sockaddr_in mine{};
    socklen_t mine_len = sizeof(mine);
    EXPECT_EQ(
        ::getsockname(c.client, reinterpret_cast<sockaddr*>(&mine), &mine_len),
        0);
    c.peer = absl::StrCat("ipv4:127.0.0.1:", ntohs(mine.sin_port));
    fds_.push_back(c.client);
    fds_.push_back(c.accepted);
    return c;
  }

 private:
  int listener_ = -1;
  sockaddr_in addr_{};
  std::vector<int> fds_;
};

// The closer finds the server's side of a connection by its peer and
// shuts it down, and the client sees the end.
TEST(SocketCloserTest, ShutsDownTheServersSocketOfThatPeer) {
  Loopback loopback;
  const Loopback::Connection c = loopback.Connect();
  SocketCloser closer;
  EXPECT_FALSE(closer.Close(c.peer)) << "no server port yet";
  closer.set_server_port(loopback.port());
  EXPECT_EQ(closer.PeerOf(c.accepted), c.peer);
  EXPECT_EQ(closer.PeerOf(c.client), "") << "not the server's side";
  EXPECT_FALSE(closer.Close("ipv4:127.0.0.1:1"));
  EXPECT_TRUE(closer.Close(c.peer));
  char byte;
  EXPECT_EQ(::recv(c.client, &byte, 1, 0), 0) << "the client sees the end";
}

// Sends `bytes` bytes from `fd` (they fit the loopback's buffers).
void Send(int fd, size_t bytes) {
  const std::string data(bytes, 'x');
  ASSERT_EQ(::send(fd, data.data(), data.size(), 0),
            static_cast<ssize_t>(bytes));
}

// Both ways of counting, against what the test sent and read: the
// sock_diag dump (which this machine allows) and the descriptors.
class SocketCloserBytesTest : public ::testing::TestWithParam<bool> {
 protected:
  SocketCloser::BytesByPeer Bytes(const SocketCloser& sockets) {
    if (!GetParam()) return sockets.BytesReceivedFromDescriptors();
    std::optional<SocketCloser::BytesByPeer> bytes =
        sockets.BytesReceivedFromSockDiag();
    EXPECT_TRUE(bytes.has_value()) << "netlink refused the dump";
    return bytes.value_or(SocketCloser::BytesByPeer{});
  }
};

TEST_P(SocketCloserBytesTest, CountsTheBytesEachConnectionReceived) {
  Loopback loopback;
  const Loopback::Connection a = loopback.Connect();
  const Loopback::Connection b = loopback.Connect();
  SocketCloser sockets;
  EXPECT_TRUE(Bytes(sockets).empty()) << "no server port yet";
  sockets.set_server_port(loopback.port());
  const auto before = Bytes(sockets);
  ASSERT_EQ(before.size(), 2u) << "the server's sides, not the listener's";
  ASSERT_TRUE(before.contains(a.peer));
  ASSERT_TRUE(before.contains(b.peer));
  Send(a.client, 3000);
  Send(b.client, 100);
  auto after = Bytes(sockets);
  EXPECT_EQ(after[a.peer].received - before.at(a.peer).received, 3000u);
  EXPECT_EQ(after[b.peer].received - before.at(b.peer).received, 100u);
  EXPECT_EQ(after[a.peer].unread, 3000u);
  char buffer[1000];
  ASSERT_EQ(::recv(a.accepted, buffer, sizeof(buffer), 0), 1000);
  EXPECT_EQ(Bytes(sockets)[a.peer].unread, 2000u);
  // A connection the server shut down still counts until it is closed.
  ASSERT_TRUE(sockets.Close(b.peer));
  EXPECT_TRUE(Bytes(sockets).contains(a.peer));
}

// An IPv4 client of a dual-stack (IPv6) listener: gRPC spells it IPv4.
TEST_P(SocketCloserBytesTest, SpellsAMappedClientAsIpv4) {
  const int listener = ::socket(AF_INET6, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  const int off = 0;
  ::setsockopt(listener, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
  sockaddr_in6 any{};
  any.sin6_family = AF_INET6;
  any.sin6_addr = in6addr_any;
  socklen_t len = sizeof(any);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&any), len) != 0) {
    ::close(listener);
    GTEST_SKIP() << "no IPv6 here";
  }
  ASSERT_EQ(::listen(listener, 4), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&any), &len),
            0);
  const int port = ntohs(any.sin6_port);
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(port);
  ASSERT_EQ(
      ::connect(client, reinterpret_cast<const sockaddr*>(&to), sizeof(to)), 0);
  const int accepted = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(accepted, 0);
  sockaddr_in mine{};
  socklen_t mine_len = sizeof(mine);
  ASSERT_EQ(
      ::getsockname(client, reinterpret_cast<sockaddr*>(&mine), &mine_len), 0);
  Send(client, 500);
  SocketCloser sockets;
  sockets.set_server_port(port);
  const auto bytes = Bytes(sockets);
  const std::string peer =
      absl::StrCat("ipv4:127.0.0.1:", ntohs(mine.sin_port));
  EXPECT_EQ(sockets.PeerOf(accepted), peer);
  ASSERT_TRUE(bytes.contains(peer)) << "peers: " << bytes.size();
  EXPECT_EQ(bytes.at(peer).unread, 500u);
  ::close(client);
  ::close(accepted);
  ::close(listener);
}

INSTANTIATE_TEST_SUITE_P(BothWays, SocketCloserBytesTest,
                         ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "SockDiag" : "Descriptors";
                         });

// Reads what `fd` holds, as gRPC (or the closer's discard) does.
void Drain(int fd) {
  char buffer[64 << 10];
  while (::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT) > 0) {
  }
}

class ReadFloodBreakerTest : public ::testing::Test {
 protected:
  ReadFloodBreakerTest() { sockets_.set_server_port(loopback_.port()); }

  // `n` calls from `peer`, each answered.
  void AnswerCalls(const std::string& peer, int n) {
    for (int i = 0; i < n; ++i) {
      auto call = guard_.CallStarted(peer);
      ASSERT_NE(call, nullptr);
      guard_.CallEnded(*call, absl::StatusCode::kOk, absl::Milliseconds(30));
    }
  }

  Loopback loopback_;
  SocketCloser sockets_;
  RecordingCloser closer_;
  FakeClock clock_;
  ConnectionGuard guard_{ConnectionGuardOptions(), &closer_, &clock_};
  ReadFloodBreaker breaker_{&sockets_, &guard_};
};

constexpr int64_t kPer = ReadFloodBreaker::kPerConnection;

// What the messages of a connection that gRPC read `bytes` from may hold,
// in a pass and between passes.
constexpr int64_t InPass(int64_t bytes) {
  return ReadFloodBreaker::kPassBytesFactor * bytes + kPer;
}
constexpr int64_t Served(int64_t bytes) {
  return ReadFloodBreaker::kServedBytesFactor * bytes + kPer;
}

// Reads `bytes` of what `fd` holds, as gRPC does.
void Read(int fd, size_t bytes) {
  char buffer[64 << 10];
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, buffer, std::min(bytes, sizeof(buffer)), 0);
    ASSERT_GT(n, 0);
    bytes -= static_cast<size_t>(n);
  }
}

// A pass in which the memory grew by far more than what the messages read
// may hold and kPerConnection for each connection read from: the
// connection that cost the most is closed, once, for read_flood.
TEST_F(ReadFloodBreakerTest, ClosesTheConnectionReadWhileMemoryGrewPastIt) {
  const Loopback::Connection quiet = loopback_.Connect();
  const Loopback::Connection flood = loopback_.Connect();
  Send(quiet.client, 500);  // before the pass: counted once gRPC reads it
  breaker_.PassBegan();
  Send(flood.client, 20000);
  Send(quiet.client, 200);
  constexpr int64_t kMax = ReadFloodBreaker::kMaxExcess;
  breaker_.PassGoesOn(kMax - 1);
  EXPECT_TRUE(closer_.closed().empty()) << "grew by less than the line";
  Drain(flood.accepted);
  Drain(quiet.accepted);
  breaker_.PassGoesOn(kMax + InPass(20000) + InPass(700) - 1);
  EXPECT_TRUE(closer_.closed().empty()) << "the bytes read count as memory";
  breaker_.PassGoesOn(kMax + InPass(20000) + InPass(700));
  EXPECT_EQ(closer_.closed(), std::vector<std::string>{flood.peer});
  EXPECT_EQ(guard_.closed(CloseReason::kReadFlood), 1);
  EXPECT_EQ(std::string(CloseReasonName(CloseReason::kReadFlood)),
            "read_flood");
}

// The pass goes on after a close (another flood started while gRPC still
// took the first one's calls): judged afresh from the close, with half the
// allowance each time down to kMinExcess, the next flood is closed once the
// memory has grown by that much beyond what it sent; the closed connection
// is not judged again, growth with nothing read since closes nothing, and
// memory given back lowers the level growth is judged from.
TEST_F(ReadFloodBreakerTest, ClosesEachFloodOfOnePass) {
  constexpr int64_t kMax = ReadFloodBreaker::kMaxExcess;
  constexpr int64_t kMin = ReadFloodBreaker::kMinExcess;
  std::vector<Loopback::Connection> floods;
  for (int i = 0; i < 5; ++i) floods.push_back(loopback_.Connect());
  breaker_.PassBegan();
  Send(floods[0].client, 30000);
  Drain(floods[0].accepted);
  int64_t level = kMax + InPass(30000);
  breaker_.PassGoesOn(level);
  ASSERT_EQ(closer_.closed(), std::vector<std::string>{floods[0].peer});
  breaker_.PassGoesOn(level + kMax);
  EXPECT_EQ(closer_.closed().size(), 1u) << "nothing read since the close";
  // Allowances after the first close: kMax / 2, kMax / 4, then kMin.
  const int64_t allowance[] = {kMax / 2, kMax / 4, kMin, kMin};
  static_assert(kMax / 8 == kMin);
  for (int i = 1; i < 5; ++i) {
    Send(floods[i].client, 20000);
    Drain(floods[i].accepted);
    breaker_.PassGoesOn(level + allowance[i - 1] + InPass(20000) - 1);
    EXPECT_EQ(closer_.closed().size(), static_cast<size_t>(i))
        << "flood " << i << ": the bytes read since the close count as memory";
    level += allowance[i - 1] + InPass(20000);
    breaker_.PassGoesOn(level);
    ASSERT_EQ(closer_.closed().size(), static_cast<size_t>(i + 1));
    EXPECT_EQ(closer_.closed().back(), floods[i].peer);
  }
  EXPECT_EQ(guard_.closed(CloseReason::kReadFlood), 5);
  // The trim gives 40 MiB back; growth counts from there.
  const Loopback::Connection next = loopback_.Connect();
  level -= int64_t{40} << 20;
  breaker_.PassGoesOn(level);
  Send(next.client, 100);
  Drain(next.accepted);
  breaker_.PassGoesOn(level + kMin + InPass(100));
  EXPECT_EQ(closer_.closed().back(), next.peer);
  // A new pass judges from its start, with the whole allowance.
  const size_t closed = closer_.closed().size();
  breaker_.PassBegan();
  const Loopback::Connection later = loopback_.Connect();
  Send(later.client, 100);
  Drain(later.accepted);
  breaker_.PassGoesOn(kMax - 1);
  EXPECT_EQ(closer_.closed().size(), closed);
  breaker_.PassGoesOn(kMax + InPass(100));
  EXPECT_EQ(closer_.closed().back(), later.peer);
}

// A large message: the memory grows by what is read, and nothing closes,
// however long the pass; nor when nothing was read at all.
TEST_F(ReadFloodBreakerTest, LeavesALargeMessageAndAQuietPassAlone) {
  const Loopback::Connection big = loopback_.Connect();
  breaker_.PassBegan();
  breaker_.PassGoesOn(2 * ReadFloodBreaker::kMaxExcess);
  EXPECT_TRUE(closer_.closed().empty()) << "nothing read";
  breaker_.PassBegan();
  constexpr size_t kChunk = 60000;
  for (int i = 0; i < 8; ++i) {
    Send(big.client, kChunk);
    char buffer[kChunk];
    size_t drained = 0;  // as gRPC reads it
    while (drained < kChunk) {
      const ssize_t n =
          ::recv(big.accepted, buffer, sizeof(buffer) - drained, 0);
      ASSERT_GT(n, 0);
      drained += static_cast<size_t>(n);
    }
    breaker_.PassGoesOn(static_cast<int64_t>((i + 1) * kChunk) +
                        ReadFloodBreaker::kMaxExcess - 1);
  }
  EXPECT_TRUE(closer_.closed().empty());
}

// Issue 32: a flood sent whole before the pass began (its bytes wait in
// its socket) beside a trainer whose 1 MiB message arrives in the pass.
// The trainer sent more in the pass, but its calls are answered: the flood
// is closed, and the trainer never is, however the memory grows. (What
// gRPC read from both counts as memory, the flood's waiting bytes too.)
TEST_F(ReadFloodBreakerTest, ClosesTheFloodNotTheTrainerBesideIt) {
  const Loopback::Connection trainer = loopback_.Connect();
  const Loopback::Connection flood = loopback_.Connect();
  AnswerCalls(trainer.peer, 3);  // it gives back
  Send(flood.client, 30000);
  breaker_.PassBegan();
  constexpr size_t kChunk = 60000;
  constexpr int kChunks = 17;  // 1 MiB
  for (int i = 0; i < kChunks; ++i) {
    Send(trainer.client, kChunk);
    Drain(trainer.accepted);  // as gRPC reads it
  }
  Drain(flood.accepted);  // gRPC turns it into calls
  constexpr int64_t kMessage = int64_t{kChunks} * kChunk;
  constexpr int64_t kMax = ReadFloodBreaker::kMaxExcess;
  breaker_.PassGoesOn(kMax + InPass(kMessage) + InPass(30000) - 1);
  EXPECT_TRUE(closer_.closed().empty());
  breaker_.PassGoesOn(kMax + InPass(kMessage) + InPass(30000));
  EXPECT_EQ(closer_.closed(), std::vector<std::string>{flood.peer});

  // The trainer alone in a pass: nothing is closed.
  breaker_.PassBegan();
  for (int i = 0; i < kChunks; ++i) {
    Send(trainer.client, kChunk);
    Drain(trainer.accepted);
  }
  breaker_.PassGoesOn(4 * kMax);
  EXPECT_EQ(closer_.closed().size(), 1u);
}

// Between passes (the loop's thread hands events: a flood in bursts):
// memory that grew past what was sent over a window closes the costliest
// connection that does not give back and sent at least kMinCost; growth
// the bytes explain closes nothing; short passes between the looks do not
// end the window, and a quiet window starts again after kWindow.
TEST_F(ReadFloodBreakerTest, ClosesAFloodThatLeavesTheLoopEvents) {
  constexpr int64_t kMax = ReadFloodBreaker::kMaxExcess;
  constexpr int64_t kMinCost = ReadFloodBreaker::kMinCost;
  const absl::Duration look = absl::Milliseconds(5);
  absl::Time now = absl::FromUnixSeconds(1000);
  const Loopback::Connection small = loopback_.Connect();
  const Loopback::Connection flood = loopback_.Connect();
  int64_t level = 100 << 20;
  breaker_.Serving(now, level);  // the window starts
  Send(small.client, kMinCost - 1000);
  Send(flood.client, 100000);
  Drain(small.accepted);  // as gRPC reads them
  Drain(flood.accepted);
  // Growth the bytes and the per-connection allowance explain.
  level += kMax + Served(100000) + Served(kMinCost - 1000) - 1;
  now += look;
  breaker_.Serving(now, level);
  EXPECT_TRUE(closer_.closed().empty());
  // Short passes come and go; the window goes on.
  breaker_.PassBegan();
  breaker_.PassGoesOn(0);
  // Judged again once the memory grew by kMinExcess more.
  now += absl::Seconds(1);  // past the judgment's cost
  breaker_.Serving(now, level + ReadFloodBreaker::kMinExcess - 1);
  EXPECT_TRUE(closer_.closed().empty());
  // Past the last judgment's cost (10 times its real time: slow under a
  // sanitizer on a loaded machine), still inside the window.
  breaker_.Serving(now + absl::Milliseconds(500),
                   level + ReadFloodBreaker::kMinExcess);
  ASSERT_EQ(closer_.closed(), std::vector<std::string>{flood.peer});
  EXPECT_EQ(guard_.closed(CloseReason::kReadFlood), 1);
  // What the flood left is judged from the close: the small sender, under
  // kMinCost, stays however the memory grows.
  Send(small.client, 500);
  for (int i = 0; i < 20; ++i) {
    now += absl::Milliseconds(60);
    breaker_.Serving(now, level + 2 * kMax);
  }
  EXPECT_EQ(closer_.closed().size(), 1u) << "no one sent kMinCost";
}

// A window in which nothing happened starts again after kWindow; one in
// which the memory grew well past what was sent goes on, so a slow flood
// (less than kMaxExcess a window) is judged whole.
TEST_F(ReadFloodBreakerTest, JudgesASlowFloodWhole) {
  constexpr int64_t kMax = ReadFloodBreaker::kMaxExcess;
  const absl::Duration window = ReadFloodBreaker::kWindow;
  absl::Time now = absl::FromUnixSeconds(1000);
  const Loopback::Connection flood = loopback_.Connect();
  int64_t level = 100 << 20;
  breaker_.Serving(now, level);
  // Growth under kKeepWindowExcess: the window starts again.
  level += ReadFloodBreaker::kKeepWindowExcess - 1;
  now += window;
  breaker_.Serving(now, level);
  // A flood grows the memory by kMax / 3 a window, 4 windows long.
  for (int i = 0; i < 4 && closer_.closed().empty(); ++i) {
    Send(flood.client, 30000);
    Drain(flood.accepted);
    level += kMax / 3;
    now += window;
    breaker_.Serving(now, level);
  }
  EXPECT_EQ(closer_.closed(), std::vector<std::string>{flood.peer});
}

// Between passes, beside a trainer whose calls are answered: the bytes it
// sends in a window (hundreds of MB at 1 MiB a round) were answered and
// freed, so they do not excuse a flood's growth; the flood is closed.
TEST_F(ReadFloodBreakerTest, ATrainersTrafficDoesNotHideAFloodBetweenPasses) {
  constexpr int64_t kMax = ReadFloodBreaker::kMaxExcess;
  const Loopback::Connection trainer = loopback_.Connect();
  const Loopback::Connection flood = loopback_.Connect();
  AnswerCalls(trainer.peer, 3);  // it gives back
  absl::Time now = absl::FromUnixSeconds(1000);
  int64_t level = 100 << 20;
  breaker_.Serving(now, level);
  constexpr size_t kChunk = 60000;
  for (int i = 0; i < 200; ++i) {  // 12 MB, as gRPC reads it
    Send(trainer.client, kChunk);
    Drain(trainer.accepted);
  }
  Send(flood.client, 100000);
  Drain(flood.accepted);
  now += absl::Milliseconds(5);
  breaker_.Serving(now, level + kMax + Served(100000) - 1);
  EXPECT_TRUE(closer_.closed().empty());
  now += absl::Seconds(1);  // past the judgment's cost
  breaker_.Serving(
      now, level + kMax + Served(100000) + ReadFloodBreaker::kMinExcess);
  EXPECT_EQ(closer_.closed(), std::vector<std::string>{flood.peer});
}

// Issue 35: a wide first round. Hundreds of connections, none with a call
// answered yet, each sends its first message in one pass; the memory grows
// by the messages and each one's calls: no connection is closed.
TEST_F(ReadFloodBreakerTest, LeavesAWideRoundAlone) {
  constexpr int kRanks = 300;
  constexpr int64_t kMessage = 32 << 10;
  std::vector<Loopback::Connection> ranks;
  for (int i = 0; i < kRanks; ++i) ranks.push_back(loopback_.Connect());
  breaker_.PassBegan();
  for (const Loopback::Connection& r : ranks) {
    Send(r.client, kMessage);
    Drain(r.accepted);  // as gRPC reads it
  }
  constexpr int64_t kCalls = 100 << 10;  // gRPC's bookkeeping, each
  const int64_t grown = kRanks * (kMessage + kCalls);
  ASSERT_GT(grown, ReadFloodBreaker::kMaxExcess + kMessage);
  breaker_.PassGoesOn(grown);
  EXPECT_TRUE(closer_.closed().empty());
}

// A flood's requests that wait in its socket excuse nothing until gRPC
// reads them: a flood that filled its socket before the pass is closed
// once the memory grew by kMaxExcess beyond what the part read may hold.
TEST_F(ReadFloodBreakerTest, ExcusesOnlyWhatGrpcRead) {
  constexpr int64_t kMax = ReadFloodBreaker::kMaxExcess;
  const Loopback::Connection flood = loopback_.Connect();
  Send(flood.client, 100000);
  breaker_.PassBegan();
  Read(flood.accepted, 30000);
  breaker_.PassGoesOn(kMax + InPass(30000) - 1);
  EXPECT_TRUE(closer_.closed().empty());
  breaker_.PassGoesOn(kMax + InPass(30000));
  EXPECT_EQ(closer_.closed(), std::vector<std::string>{flood.peer});
}

// Issue 35: a wide first round on a loaded machine. The ranks' first
// messages (Moments of 2,048 channels: 32 KiB, and framing) reach their
// sockets while the server's thread is off the CPU, and gRPC reads them in
// the pass that follows: the memory grows by each message (in the buffers
// it was read into) and its call, though not a byte arrived in the pass,
// and no rank has an answer yet. The breaker once excused only the bytes
// that arrived in the pass, and closed a rank (UNAVAILABLE "Socket
// closed") once 400 messages of the round's 4,096 had waited.
TEST_F(ReadFloodBreakerTest, LeavesAWideRoundWhoseMessagesWaitedForThePass) {
  constexpr int kRanks = 400;
  constexpr int64_t kMessage = (32 << 10) + 100;
  constexpr int64_t kCall = 53000;  // gRPC's most for a call (flood_test)
  std::vector<Loopback::Connection> ranks;
  for (int i = 0; i < kRanks; ++i) ranks.push_back(loopback_.Connect());
  for (const Loopback::Connection& r : ranks) Send(r.client, kMessage);
  breaker_.PassBegan();
  for (const Loopback::Connection& r : ranks) Drain(r.accepted);
  const int64_t grown = kRanks * (2 * kMessage + kCall);
  ASSERT_GT(grown, ReadFloodBreaker::kMaxExcess);
  breaker_.PassGoesOn(grown);
  EXPECT_TRUE(closer_.closed().empty());
}

// A wide round served between passes (the loop's thread hands events), of
// 4,096 channels: each rank's 64 KiB message is over kMinCost, and none is
// answered yet. The loop parses each message, the round keeps its copy,
// and each rank's answer waits as a proto and serialized: the memory grows
// by five times the bytes and a call each, and no rank is closed.
TEST_F(ReadFloodBreakerTest, LeavesAWideRoundServedBetweenPassesAlone) {
  constexpr int kRanks = 300;
  constexpr int64_t kMessage = (64 << 10) + 100;
  static_assert(kMessage >= ReadFloodBreaker::kMinCost);
  constexpr int64_t kCall = 53000;
  std::vector<Loopback::Connection> ranks;
  for (int i = 0; i < kRanks; ++i) ranks.push_back(loopback_.Connect());
  absl::Time now = absl::FromUnixSeconds(1000);
  int64_t level = 100 << 20;
  breaker_.Serving(now, level);  // the window starts
  for (const Loopback::Connection& r : ranks) {
    Send(r.client, kMessage);
    Drain(r.accepted);  // as gRPC reads it
  }
  const int64_t grown = kRanks * (5 * kMessage + kCall);
  ASSERT_GT(grown, ReadFloodBreaker::kMaxExcess);
  for (int i = 0; i < 10; ++i) {
    now += absl::Milliseconds(100);
    breaker_.Serving(now, level + grown);
  }
  EXPECT_TRUE(closer_.closed().empty());
}

// The same round when the windows fall badly (issue 35, W = 2,048 on a
// real server): most ranks' messages are read in one window, the last
// ones in the next, in which the round completes and most answers are
// written. The ranks answered give back from then on, but their answers
// grow the memory in this window; the ranks still waiting for theirs (the
// costliest that do not give back) are not closed for it.
TEST_F(ReadFloodBreakerTest, LeavesAWideRoundAnsweredInALaterWindowAlone) {
  constexpr int kRanks = 400;
  constexpr int kLate = 40;  // read in the second window, not yet answered
  constexpr int64_t kMessage = (64 << 10) + 100;
  constexpr int64_t kCall = 53000;
  std::vector<Loopback::Connection> ranks;
  std::vector<std::shared_ptr<ConnectionGuard::Connection>> streams;
  for (int i = 0; i < kRanks; ++i) {
    ranks.push_back(loopback_.Connect());
    streams.push_back(guard_.CallStarted(ranks.back().peer));
    ASSERT_NE(streams.back(), nullptr);
    guard_.MessageAnswered(*streams.back());  // its first round's
  }
  absl::Time now = absl::FromUnixSeconds(1000);
  int64_t level = 100 << 20;
  breaker_.Serving(now, level);
  // Each message read, parsed and copied into the round.
  for (int i = 0; i < kRanks - kLate; ++i) {
    Send(ranks[i].client, kMessage);
    Drain(ranks[i].accepted);
  }
  level += (kRanks - kLate) * (3 * kMessage + kCall);
  now += ReadFloodBreaker::kWindow;
  breaker_.Serving(now, level);  // the window ends
  for (int i = kRanks - kLate; i < kRanks; ++i) {
    Send(ranks[i].client, kMessage);
    Drain(ranks[i].accepted);
  }
  // Every answer, as a proto and serialized; the first ones written.
  level += kLate * (3 * kMessage + kCall) + kRanks * 2 * kMessage;
  for (int i = 0; i < kRanks - kLate; ++i) guard_.MessageAnswered(*streams[i]);
  for (int i = 0; i < 10; ++i) {
    now += absl::Milliseconds(100);
    breaker_.Serving(now, level);
  }
  EXPECT_TRUE(closer_.closed().empty());
  for (auto& s : streams) {
    guard_.CallEnded(*s, absl::StatusCode::kOk, absl::Seconds(1));
  }
}

// What a connection read before it last gave back at a window's start is
// held no more: a trainer whose record the guard dropped (a minute without
// calls) no longer gives back, but its past traffic excuses no flood.
TEST_F(ReadFloodBreakerTest, ATrainersPastTrafficDoesNotHideAFlood) {
  constexpr int64_t kMax = ReadFloodBreaker::kMaxExcess;
  const Loopback::Connection trainer = loopback_.Connect();
  const Loopback::Connection flood = loopback_.Connect();
  AnswerCalls(trainer.peer, 3);
  absl::Time now = absl::FromUnixSeconds(1000);
  int64_t level = 100 << 20;
  breaker_.Serving(now, level);
  constexpr size_t kChunk = 60000;
  for (int i = 0; i < 200; ++i) {  // 12 MB
    Send(trainer.client, kChunk);
    Drain(trainer.accepted);
  }
  now += ReadFloodBreaker::kWindow;
  breaker_.Serving(now, level);  // the window ends; the trainer gave back
  clock_.Advance(absl::Minutes(2));
  AnswerCalls("ipv4:10.0.0.9:1", 1);  // the guard drops the trainer's record
  ASSERT_FALSE(guard_.PeersGivingBack().contains(trainer.peer));
  Send(flood.client, 100000);
  Drain(flood.accepted);
  now += absl::Milliseconds(500);  // past the window-end judgment's cost
  breaker_.Serving(now, level + kMax + Served(100000));
  EXPECT_EQ(closer_.closed(), std::vector<std::string>{flood.peer});
}

}  // namespace
}  // namespace syncnorm
