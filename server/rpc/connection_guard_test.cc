// The ConnectionGuard's lines, each crossed by one call more, with a fake
// closer; and the SocketCloser on real loopback sockets.
#include "server/rpc/connection_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "server/domain/fake_clock.h"
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

// A loopback connection to a listening socket of "the server": the
// closer finds it by its peer and shuts it down, and the client sees the
// end.
TEST(SocketCloserTest, ShutsDownTheServersSocketOfThatPeer) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len),
            0);
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&addr), len), 0);
  const int accepted = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(accepted, 0);
  sockaddr_in mine{};
  socklen_t mine_len = sizeof(mine);
  ASSERT_EQ(
      ::getsockname(client, reinterpret_cast<sockaddr*>(&mine), &mine_len), 0);
  const std::string peer =
      absl::StrCat("ipv4:127.0.0.1:", ntohs(mine.sin_port));

  SocketCloser closer;
  EXPECT_FALSE(closer.Close(peer)) << "no server port yet";
  closer.set_server_port(ntohs(addr.sin_port));
  EXPECT_EQ(closer.PeerOf(accepted), peer);
  EXPECT_EQ(closer.PeerOf(client), "") << "not the server's side";
  EXPECT_FALSE(closer.Close("ipv4:127.0.0.1:1"));
  EXPECT_TRUE(closer.Close(peer));
  char c;
  EXPECT_EQ(::recv(client, &c, 1, 0), 0) << "the client sees the end";
  for (int fd : {client, accepted, listener}) ::close(fd);
}

}  // namespace
}  // namespace syncnorm
