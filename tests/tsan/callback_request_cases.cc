// The hand-off of a callback-API call from the thread that accepts it to
// the thread that runs its handler (server_request_annotations.cc): a
// server whose context allocator, which gRPC calls as it accepts the call,
// writes shared_data, and whose handler reads it. Synced: the allocator
// writes. Racy: another thread writes, once the allocator has run, which
// nothing orders with the handler's read.
#include <atomic>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "tests/tsan/cases.h"

namespace syncnorm::tsan {
namespace {

// Relaxed atomics: no happens-before edges for TSan.
std::atomic<bool> accepted{false};
std::atomic<bool> written{false};

class WritingAllocator final : public grpc::ContextAllocator {
 public:
  explicit WritingAllocator(bool racy) : racy_(racy) {}
  grpc::GenericCallbackServerContext* NewGenericCallbackServerContext()
      override {
    if (!racy_) {
      WriteShared(1);
      written.store(true, std::memory_order_relaxed);
    }
    accepted.store(true, std::memory_order_relaxed);
    return new grpc::GenericCallbackServerContext();
  }
  void Release(grpc::GenericCallbackServerContext* context) override {
    delete context;
  }

 private:
  const bool racy_;
};

class ReadingService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext*) override {
    while (!written.load(std::memory_order_relaxed)) std::this_thread::yield();
    (void)ReadShared();
    class Finisher final : public grpc::ServerGenericBidiReactor {
     public:
      Finisher() { Finish(grpc::Status::OK); }
      void OnDone() override { delete this; }
    };
    return new Finisher();
  }
};

void RunCallbackRequest(bool racy) {
  ReadingService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterCallbackGenericService(&service);
  builder.SetContextAllocator(std::make_unique<WritingAllocator>(racy));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  std::thread writer([racy] {
    if (!racy) return;
    while (!accepted.load(std::memory_order_relaxed)) std::this_thread::yield();
    WriteShared(2);
    written.store(true, std::memory_order_relaxed);
  });
  grpc::GenericStub stub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  grpc::Slice payload("x");
  grpc::ByteBuffer request(&payload, 1), response;
  absl::Notification answered;
  stub.UnaryCall(&context, "/tsan.Cases/Call", grpc::StubOptions(), &request,
                 &response, [&answered](grpc::Status) { answered.Notify(); });
  answered.WaitForNotification();
  writer.join();
  server->Shutdown();
}

}  // namespace

std::vector<Case> CallbackRequestCases() {
  return {{"callback_request", RunCallbackRequest}};
}

}  // namespace syncnorm::tsan
