// Calls served by an RpcLoop, with reactors shaped like gRPC's callback
// API's (StartRead, StartWrite, Finish; OnReadDone, OnWriteDone, OnCancel,
// OnDone), so that a call's logic reads the same on either API.
//
// A method listens with one request posted to gRPC at a time: when a call
// arrives, the next request is posted and the method's Start makes the
// call's reactor. Every reaction runs on the loop's thread, one at a time;
// Start*/Finish may be called from any thread, as in the callback API: at
// most one read and one write outstanding, Finish once and not while a
// write is. The call (its context and stream) lives until it is over
// (gRPC's done tag), Finish has been called and completed, and no read or
// write is outstanding; then the reactor's OnDone runs, after which the
// reactor must not touch the call.
#ifndef SYNCNORM_SERVER_RPC_ASYNC_CALL_H_
#define SYNCNORM_SERVER_RPC_ASYNC_CALL_H_

#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/impl/codegen/proto_utils.h"  // protobuf messages on the wire
#include "grpcpp/server_context.h"
#include "grpcpp/support/async_stream.h"
#include "grpcpp/support/async_unary_call.h"
#include "grpcpp/support/status.h"
#include "server/rpc/rpc_loop.h"

namespace syncnorm {

// What every call shares: its tags, its context, and when it is over.
class LoopCall {
 public:
  LoopCall(const LoopCall&) = delete;
  LoopCall& operator=(const LoopCall&) = delete;

  grpc::ServerContext& context() { return context_; }

 protected:
  enum Kind { kAccept, kRead, kWrite, kFinish, kDone, kKinds };

  explicit LoopCall(RpcLoop* loop) : loop_(loop) {
    for (int k = 0; k < kKinds; ++k) {
      tags_[k].call = this;
      tags_[k].kind = static_cast<Kind>(k);
    }
    context_.AsyncNotifyWhenDone(tag(kDone));
  }
  virtual ~LoopCall() = default;

  void* tag(Kind kind) { return &tags_[kind]; }
  RpcLoop* loop() const { return loop_; }

  // The call has arrived: counted until it is over.
  void Arrived() {
    loop_->CallArrived();
    absl::MutexLock lock(&mu_);
    pending_ = 1;  // the done tag
  }
  // Before starting a read or write; before Finish, with `finish`.
  void StartOp(bool finish = false) {
    absl::MutexLock lock(&mu_);
    ++pending_;
    if (finish) finish_called_ = true;
  }

  // Runs the reaction to a completed tag (kAccept: the call arrived, or
  // with !ok the server shuts down; kDone: `cancelled` says how it ended).
  virtual void React(Kind kind, bool ok, bool cancelled) = 0;
  // The call is over: the reactor's OnDone.
  virtual void Over() = 0;

 private:
  struct Tag final : CqTag {
    LoopCall* call = nullptr;
    Kind kind = kAccept;
    void Run(bool ok) override { call->OnTag(kind, ok); }
  };

  void OnTag(Kind kind, bool ok) {
    if (kind == kAccept) {
      if (!ok) {
        delete this;  // never arrived: the server is shutting down
        return;
      }
      Arrived();
    }
    React(kind, ok, kind == kDone && context_.IsCancelled());
    if (kind == kAccept) return;  // no op of its own to count
    bool over = false;
    {
      absl::MutexLock lock(&mu_);
      over = --pending_ == 0 && finish_called_;
    }
    if (!over) return;
    Over();
    RpcLoop* loop = loop_;
    delete this;
    loop->CallReleased();
  }

  RpcLoop* const loop_;
  Tag tags_[kKinds];
  LoopServerContext context_;

  absl::Mutex mu_;
  // Tags outstanding: the done tag, and each read, write and Finish.
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
};

template <typename Req, typename Resp>
class BidiReactor;

// A bidirectional-streaming call.
template <typename Req, typename Resp>
class BidiCall final : public LoopCall {
 public:
  using Stream = grpc::ServerAsyncReaderWriter<Resp, Req>;
  struct Method {
    // Posts the request for the method's next call (the generated
    // AsyncService::RequestX, bound).
    std::function<void(grpc::ServerContext*, Stream*,
                       grpc::ServerCompletionQueue*, void*)>
        request;
    // Makes the arrived call's reactor (which binds itself to it).
    std::function<void(BidiCall*)> start;
  };

  // `request` bound to `service`, the call notified on the loop's queue.
  template <typename Service, typename Base>
  static auto Requester(Service* service,
                        void (Base::*request)(grpc::ServerContext*, Stream*,
                                              grpc::CompletionQueue*,
                                              grpc::ServerCompletionQueue*,
                                              void*)) {
    return [service, request](grpc::ServerContext* context, Stream* stream,
                              grpc::ServerCompletionQueue* cq, void* tag) {
      (service->*request)(context, stream, cq, cq, tag);
    };
  }

  // Listens for `method`'s calls; `method` must outlive them.
  static void Listen(RpcLoop* loop, const Method* method) {
    new BidiCall(loop, method);  // deletes itself
  }

 private:
  friend class BidiReactor<Req, Resp>;

  BidiCall(RpcLoop* loop, const Method* method)
      : LoopCall(loop), method_(method), stream_(&context()) {
    method_->request(&context(), &stream_, loop->cq(), tag(kAccept));
  }

  void React(Kind kind, bool ok, bool cancelled) override {
    switch (kind) {
      case kAccept:
        Listen(loop(), method_);  // the next call's request
        method_->start(this);
        return;
      case kRead:
        reactor_->OnReadDone(ok);
        return;
      case kWrite:
        reactor_->OnWriteDone(ok);
        return;
      case kFinish:
        return;
      case kDone:
        if (cancelled) reactor_->OnCancel();
        return;
      case kKinds:
        return;
    }
  }
  void Over() override { reactor_->OnDone(); }

  const Method* const method_;
  Stream stream_;
  BidiReactor<Req, Resp>* reactor_ = nullptr;
};

// The reactor of a BidiCall, as grpc::ServerBidiReactor.
template <typename Req, typename Resp>
class BidiReactor {
 public:
  virtual ~BidiReactor() = default;
  virtual void OnReadDone(bool /*ok*/) {}
  virtual void OnWriteDone(bool /*ok*/) {}
  virtual void OnCancel() {}
  virtual void OnDone() = 0;

 protected:
  explicit BidiReactor(BidiCall<Req, Resp>* call) : call_(call) {
    call_->reactor_ = this;
  }

  void StartRead(Req* request) {
    call_->StartOp();
    call_->stream_.Read(request, call_->tag(BidiCall<Req, Resp>::kRead));
  }
  // `response` is serialized at once.
  void StartWrite(const Resp* response) {
    call_->StartOp();
    call_->stream_.Write(*response, call_->tag(BidiCall<Req, Resp>::kWrite));
  }
  void Finish(grpc::Status status) {
    call_->StartOp(/*finish=*/true);
    call_->stream_.Finish(status, call_->tag(BidiCall<Req, Resp>::kFinish));
  }

 private:
  BidiCall<Req, Resp>* const call_;
};

class UnaryReactor;

// Finishes a unary call; UnaryCall's face to its reactor.
class UnaryFinisher {
 public:
  virtual void Finish(grpc::Status status) = 0;

 protected:
  ~UnaryFinisher() = default;

 private:
  friend class UnaryReactor;
  virtual void Bind(UnaryReactor* reactor) = 0;
};

// The reactor of a unary call that waits for something (as
// grpc::ServerUnaryReactor): OnCancel, OnDone.
class UnaryReactor {
 public:
  virtual ~UnaryReactor() = default;
  virtual void OnCancel() {}
  virtual void OnDone() = 0;

 protected:
  explicit UnaryReactor(UnaryFinisher* call) : call_(call) {
    call_->Bind(this);
  }
  void Finish(grpc::Status status) { call_->Finish(std::move(status)); }

 private:
  UnaryFinisher* const call_;
};

// A unary call: its request, and the response that Finish sends when OK.
// Without a reactor, whatever Start hands it to finishes it.
template <typename Req, typename Resp>
class UnaryCall final : public LoopCall, public UnaryFinisher {
 public:
  using Responder = grpc::ServerAsyncResponseWriter<Resp>;
  struct Method {
    std::function<void(grpc::ServerContext*, Req*, Responder*,
                       grpc::ServerCompletionQueue*, void*)>
        request;
    std::function<void(UnaryCall*)> start;
  };

  // As BidiCall::Requester.
  template <typename Service, typename Base>
  static auto Requester(Service* service,
                        void (Base::*request)(grpc::ServerContext*, Req*,
                                              Responder*,
                                              grpc::CompletionQueue*,
                                              grpc::ServerCompletionQueue*,
                                              void*)) {
    return [service, request](grpc::ServerContext* context, Req* req,
                              Responder* responder,
                              grpc::ServerCompletionQueue* cq, void* tag) {
      (service->*request)(context, req, responder, cq, cq, tag);
    };
  }

  static void Listen(RpcLoop* loop, const Method* method) {
    new UnaryCall(loop, method);  // deletes itself
  }

  const Req& request() const { return request_; }
  Resp* response() { return &response_; }

  void Finish(grpc::Status status) override {
    StartOp(/*finish=*/true);
    if (status.ok()) {
      responder_.Finish(response_, status, tag(kFinish));
    } else {
      responder_.FinishWithError(status, tag(kFinish));
    }
  }

 private:
  UnaryCall(RpcLoop* loop, const Method* method)
      : LoopCall(loop), method_(method), responder_(&context()) {
    method_->request(&context(), &request_, &responder_, loop->cq(),
                     tag(kAccept));
  }

  void Bind(UnaryReactor* reactor) override { reactor_ = reactor; }

  void React(Kind kind, bool /*ok*/, bool cancelled) override {
    if (kind == kAccept) {
      Listen(loop(), method_);
      method_->start(this);
    } else if (kind == kDone && cancelled && reactor_ != nullptr) {
      reactor_->OnCancel();
    }
  }
  void Over() override {
    if (reactor_ != nullptr) reactor_->OnDone();
  }

  const Method* const method_;
  Req request_;
  Resp response_;
  Responder responder_;
  UnaryReactor* reactor_ = nullptr;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_ASYNC_CALL_H_
