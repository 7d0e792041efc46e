#include "relay/relay_service.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/domain/limits.h"
#include "server/domain/log.h"
#include "server/rpc/async_call.h"
#include "server/rpc/call_outcome.h"

namespace syncnorm {
namespace relay_service_internal {
class ReduceStream;
using RawBidiCall = BidiCall<grpc::ByteBuffer, grpc::ByteBuffer>;
using ReduceOnceCall = UnaryCall<v1::Contribution, v1::RoundResult>;
}  // namespace relay_service_internal
namespace {

// Set while this thread is in Relay::Contribute (or answers a refusal of
// the service's own): an answer given then is a refusal, as Relay answers
// only those inline (relay.h).
thread_local bool t_refusing = false;

class RefusingScope {
 public:
  RefusingScope() : before_(t_refusing) { t_refusing = true; }
  ~RefusingScope() { t_refusing = before_; }

 private:
  const bool before_;
};

std::string Authorization(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

// Whether the relay takes `c` from this caller. A child relay's block
// needs the `relay` scope besides the job's, as the shard asks (a rank's
// job token cannot vouch for other ranks).
absl::Status AdmitContribution(const Authenticator* auth,
                               const std::string& authorization,
                               const v1::Contribution& c) {
  if (c.round_age_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round_age_ms ", c.round_age_ms(),
        " is negative; a relay sets how long the round had been open at it, "
        "at least 0, and a rank leaves it unset"));
  }
  if (auth == nullptr) return absl::OkStatus();
  return c.has_relay() ? auth->AuthorizeRelay(authorization, c.job_id())
                       : auth->AuthorizeJob(authorization, c.job_id());
}

// Drops the round age of an admitted `c` from a caller without the `relay`
// scope, as the shard drops it (a rank's would close the round early for
// everyone).
void DropUntrustedRoundAge(const Authenticator* auth,
                           const std::string& authorization,
                           v1::Contribution& c) {
  if (auth != nullptr && c.round_age_ms() > 0 && !c.has_relay() &&
      !auth->AuthorizeRelay(authorization, c.job_id()).ok()) {
    c.clear_round_age_ms();
  }
}

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

// The key of `c` (job, layer, step, phase, backward index), for the
// answer to a message refused unread.
v1::Contribution KeyOf(const v1::Contribution& c) {
  v1::Contribution key;
  key.set_job_id(c.job_id());
  key.set_layer(c.layer());
  key.set_step(c.step());
  key.set_phase(c.phase());
  key.set_backward_index(c.backward_index());
  key.set_rank(c.rank());
  return key;
}

}  // namespace

using relay_service_internal::ReduceStream;

struct RelayService::State {
  State(Relay& r, RelayServiceOptions o) : relay(r), options(std::move(o)) {}

  // The bytes a stream may hold before it reads no more; 0: no bound.
  int64_t held_cap() const {
    return options.max_message_bytes > 0
               ? kHeldMessagesPerStream * options.max_message_bytes
               : 0;
  }

  void Counted(const RoundAnswer& answer) {
    const int code =
        answer->result.has_error() ? answer->result.error().code() : 0;
    if (code < 0 || code >= 17) return;
    answers[code].fetch_add(1, std::memory_order_relaxed);
    if (t_refusing && code != 0) {
      refusals[code].fetch_add(1, std::memory_order_relaxed);
    }
  }

  // A stream takes a --max_streams slot: OK, RESOURCE_EXHAUSTED naming the
  // flag, UNAVAILABLE once the service is closing.
  absl::Status Enter(const std::shared_ptr<ReduceStream>& stream)
      ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    if (closed) {
      return absl::UnavailableError(
          "the relay is shutting down; reconnect to a running relay");
    }
    if (options.max_streams > 0 &&
        streams.size() >= static_cast<size_t>(options.max_streams)) {
      return LimitExceeded("a new Reduce stream: the open streams",
                           "max_streams", options.max_streams, "relay");
    }
    streams.emplace(stream.get(), stream);
    return absl::OkStatus();
  }
  void Leave(ReduceStream* stream) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    streams.erase(stream);
  }
  // The open streams, held for the caller (not under the lock: a stream's
  // last reference may go with them).
  std::vector<std::shared_ptr<ReduceStream>> Live() ABSL_LOCKS_EXCLUDED(mu) {
    std::vector<std::shared_ptr<ReduceStream>> live;
    absl::MutexLock lock(&mu);
    live.reserve(streams.size());
    for (const auto& entry : streams) {
      if (std::shared_ptr<ReduceStream> s = entry.second.lock()) {
        live.push_back(std::move(s));
      }
    }
    return live;
  }

  // A ReduceOnce takes a --max_waiting_calls slot (never above the limit,
  // not even for a moment).
  absl::Status EnterWaiting() {
    int calls = waiting.load(std::memory_order_acquire);
    do {
      if (options.max_waiting_calls > 0 && calls >= options.max_waiting_calls) {
        return LimitExceeded(
            "a ReduceOnce call: the ReduceOnce calls in progress on this relay",
            "max_waiting_calls", options.max_waiting_calls, "relay");
      }
    } while (!waiting.compare_exchange_weak(calls, calls + 1,
                                            std::memory_order_acq_rel));
    return absl::OkStatus();
  }

  Relay& relay;
  const RelayServiceOptions options;

  std::atomic<int64_t> contributions{0};
  std::array<std::atomic<int64_t>, 17> answers{};
  std::array<std::atomic<int64_t>, 17> refusals{};
  std::atomic<int64_t> held_bytes{0};
  std::atomic<int> waiting{0};
  std::atomic<int64_t> idle_closed{0};

  absl::Mutex mu;
  // The streams holding a slot. Weak: a stream leaves in its destructor.
  absl::flat_hash_map<ReduceStream*, std::weak_ptr<ReduceStream>> streams
      ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;
};

using State = RelayService::State;

namespace relay_service_internal {

// One rank's Reduce stream: each contribution goes to the relay, each
// answer is written when it comes, one write at a time. Owns itself until
// gRPC is done with the call and every answer has come back; holds its
// --max_streams slot as long.
class ReduceStream final
    : public BidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  static void Start(RawBidiCall* call, std::shared_ptr<State> state) {
    auto stream =
        std::shared_ptr<ReduceStream>(new ReduceStream(call, std::move(state)));
    stream->self_ = stream;
    stream->Admit();
  }

  ~ReduceStream() override {
    if (admitted_) state_->Leave(this);
    // What it still held: contributions of a relay that went away first.
    int64_t held;
    {
      absl::MutexLock lock(&mu_);
      held = held_;
    }
    state_->held_bytes.fetch_sub(held, std::memory_order_relaxed);
    if (state_->options.guard != nullptr) state_->options.guard->CallReleased();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      bool finish;
      {
        absl::MutexLock lock(&mu_);
        reads_done_ = true;
        finish = ShouldFinish();
      }
      if (finish) FinishWith(FinalStatus());
      return;
    }
    for (const std::unique_ptr<CallObserver>& o : observers_) {
      o->MessageReceived();
    }
    const size_t bytes = request_.Length();
    v1::Contribution c;
    // Takes the buffer's bytes, leaving it empty for the next read.
    if (!grpc::SerializationTraits<v1::Contribution>::Deserialize(&request_, &c)
             .ok()) {
      // As the typed API: the call fails, and its answers go nowhere.
      bool finish;
      {
        absl::MutexLock lock(&mu_);
        unparsable_ = true;
        reads_done_ = true;
        Break();
        finish = ShouldFinish();
      }
      if (finish) FinishWith(FinalStatus());
      return;
    }
    {
      // A stream being closed takes nothing more: its client resends what
      // is unanswered on its next stream.
      bool drop = false;
      bool finish = false;
      {
        absl::MutexLock lock(&mu_);
        if (closing_ || broken_) {
          drop = reads_done_ = true;
          finish = ShouldFinish();
        }
      }
      if (drop) {
        if (finish) FinishWith(FinalStatus());
        return;
      }
    }
    state_->contributions.fetch_add(1, std::memory_order_relaxed);
    absl::Status refused =
        CheckMessageSize(bytes, "a Reduce stream message",
                         state_->options.max_message_bytes, "relay");
    // An oversized payload goes no further than this check.
    const int64_t held = refused.ok() ? static_cast<int64_t>(bytes) : 0;
    if (!refused.ok()) c = KeyOf(c);
    bool hold;
    {
      absl::MutexLock lock(&mu_);
      ++pending_;
      held_ += held;
      last_active_ = absl::Now();
      hold = FullLocked();
      read_held_ = hold;
    }
    state_->held_bytes.fetch_add(held, std::memory_order_relaxed);
    if (refused.ok()) {
      refused = AdmitContribution(state_->options.auth, authorization_, c);
    }
    if (refused.ok()) {
      DropUntrustedRoundAge(state_->options.auth, authorization_, c);
    }
    // The answer keeps the stream alive: it may come after OnDone.
    std::shared_ptr<ReduceStream> me = self_;
    {
      RefusingScope refusing;
      if (!refused.ok()) {
        Answer(ErrorAnswer(c, refused), held);
      } else {
        state_->relay.Contribute(std::move(c),
                                 [me, held](const RoundAnswer& answer) {
                                   me->Answer(answer, held);
                                 });
      }
    }
    if (!hold) StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    RoundAnswer next;
    bool release;
    bool finish;
    int64_t written;
    {
      absl::MutexLock lock(&mu_);
      written = queue_.front().bytes;
      held_ -= written;
      queue_.pop_front();
      --pending_;
      last_active_ = absl::Now();
      if (!ok) Break();
      if (!queue_.empty()) {
        next = queue_.front().answer;
      } else {
        writing_ = false;
      }
      release = read_held_ && !broken_ && !closing_ && !FullLocked();
      if (release) read_held_ = false;
      finish = ShouldFinish();
    }
    state_->held_bytes.fetch_sub(written, std::memory_order_relaxed);
    if (next != nullptr) Write(next);
    if (release) StartRead(&request_);
    if (finish) FinishWith(FinalStatus());
  }

  void OnCancel() override {
    bool finish;
    {
      absl::MutexLock lock(&mu_);
      Break();
      finish = ShouldFinish();
    }
    if (finish) FinishWith(FinalStatus());
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    if (outcome_ != nullptr) {
      if (std::optional<CallOutcome::Result> r = outcome_->Done()) {
        for (const std::unique_ptr<CallObserver>& o : observers_) o->Ended(*r);
      }
    }
    self_.reset();
  }

  // Ends the stream UNAVAILABLE if it holds nothing and has read, answered
  // and written nothing for `timeout`; whether it did.
  bool CloseIfIdle(absl::Time now, absl::Duration timeout) {
    bool finish;
    {
      absl::MutexLock lock(&mu_);
      if (done_ || finished_ || broken_ || closing_ || pending_ > 0 ||
          !queue_.empty() || now - last_active_ < timeout) {
        return false;
      }
      closing_ = true;
      close_status_ = grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          absl::StrCat("the stream was idle for ",
                       absl::ToInt64Milliseconds(now - last_active_),
                       " ms, past the relay's --stream_idle_timeout_ms=",
                       absl::ToInt64Milliseconds(timeout),
                       "; open a new stream to send more (the syncnorm "
                       "clients do so by themselves)"));
      finish = ShouldFinish();
    }
    if (finish) FinishWith(FinalStatus());
    return true;
  }

  // Ends the stream with `status` once it has answered and written all it
  // read; it reads nothing more.
  void Close(grpc::Status status) {
    bool finish;
    {
      absl::MutexLock lock(&mu_);
      if (done_ || finished_ || closing_) return;
      closing_ = true;
      close_status_ = std::move(status);
      finish = ShouldFinish();
    }
    if (finish) FinishWith(FinalStatus());
  }

 private:
  struct Queued {
    RoundAnswer answer;
    int64_t bytes;  // the answer's on the wire
  };

  ReduceStream(RawBidiCall* call, std::shared_ptr<State> state)
      : BidiReactor(call),
        authorization_(Authorization(call->context())),
        state_(std::move(state)) {
    grpc::ServerContext* context = &call->context();
    if (state_->options.guard != nullptr) state_->options.guard->CallArrived();
    // The guard's and the metrics' interceptors skip Reduce
    // (call_observer.h): it reports itself.
    for (CallObserverFactory* f : state_->options.call_observers) {
      observers_.push_back(f->CallStarted(
          *context, kSelfReportingMethod,
          grpc::experimental::ServerRpcInfo::Type::BIDI_STREAMING));
    }
    if (!observers_.empty()) outcome_ = std::make_unique<CallOutcome>(context);
    last_active_ = absl::Now();
  }

  // As the aggregator's stream: a caller without a token in force ends
  // before it takes a slot; then the slot, or RESOURCE_EXHAUSTED.
  void Admit() {
    absl::Status refused = absl::OkStatus();
    if (state_->options.auth != nullptr) {
      refused = state_->options.auth->Authenticate(authorization_);
    }
    if (refused.ok()) refused = state_->Enter(self_);
    if (!refused.ok()) {
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
      }
      const int code = static_cast<int>(refused.code());
      if (code > 0 && code < 17) {
        state_->refusals[code].fetch_add(1, std::memory_order_relaxed);
      }
      FinishWith(ToGrpc(refused));
      return;
    }
    admitted_ = true;
    StartRead(&request_);
  }

  // The answer to a contribution that held `request_bytes`: counted, then
  // written after those before it; dropped once the stream broke.
  void Answer(const RoundAnswer& answer, int64_t request_bytes)
      ABSL_LOCKS_EXCLUDED(mu_) {
    state_->Counted(answer);
    const int64_t answer_bytes = static_cast<int64_t>(answer->bytes.Length());
    bool write = false;
    bool finish = false;
    int64_t change = -request_bytes;
    {
      absl::MutexLock lock(&mu_);
      held_ -= request_bytes;
      last_active_ = absl::Now();
      if (broken_ || finished_) {
        --pending_;
        finish = ShouldFinish();
      } else {
        queue_.push_back(Queued{answer, answer_bytes});
        held_ += answer_bytes;
        change += answer_bytes;
        write = !writing_;
        writing_ = true;
      }
    }
    state_->held_bytes.fetch_add(change, std::memory_order_relaxed);
    // Outside the lock: gRPC may run a reaction on this thread.
    if (write) Write(answer);
    if (finish) FinishWith(FinalStatus());
  }

  void Write(const RoundAnswer& answer) {
    for (const std::unique_ptr<CallObserver>& o : observers_) o->MessageSent();
    StartWrite(&answer->bytes);
  }

  void FinishWith(const grpc::Status& status) {
    if (outcome_ != nullptr) outcome_->StatusSent(status.error_code());
    Finish(status);
  }

  // Whether to read no more for now.
  bool FullLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t cap = state_->held_cap();
    return pending_ >= kMaxUnansweredPerStream || (cap > 0 && held_ >= cap);
  }

  // The call is gone: no more writes, no more reads.
  void Break() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    broken_ = true;
    if (read_held_) {
      read_held_ = false;
      reads_done_ = true;
    }
    // A write in flight keeps its answer until OnWriteDone.
    const size_t keep = writing_ ? 1 : 0;
    int64_t dropped = 0;
    while (queue_.size() > keep) {
      dropped += queue_.back().bytes;
      queue_.pop_back();
      --pending_;
    }
    held_ -= dropped;
    state_->held_bytes.fetch_sub(dropped, std::memory_order_relaxed);
  }

  // Whether to Finish now (then marks it finished).
  bool ShouldFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_) return false;
    const bool ready =
        broken_ ? reads_done_ : pending_ == 0 && (reads_done_ || closing_);
    if (!ready) return false;
    finished_ = true;
    return true;
  }

  grpc::Status FinalStatus() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (unparsable_) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a Reduce stream message is not a Contribution");
    }
    if (broken_) return grpc::Status::CANCELLED;
    return closing_ ? close_status_ : grpc::Status::OK;
  }

  // Constant after construction (admitted_ once Admit returned).
  const std::string authorization_;
  const std::shared_ptr<State> state_;
  std::vector<std::unique_ptr<CallObserver>> observers_;
  std::unique_ptr<CallOutcome> outcome_;  // with observers
  bool admitted_ = false;

  grpc::ByteBuffer request_;            // the read in flight's
  std::shared_ptr<ReduceStream> self_;  // until OnDone

  absl::Mutex mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);  // front: writing
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;   // read, not yet answered+written
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;  // their bytes and the answers'
  absl::Time last_active_ ABSL_GUARDED_BY(mu_);
  bool read_held_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // ends once it holds nothing
  grpc::Status close_status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // OnDone ran
  bool unparsable_ ABSL_GUARDED_BY(mu_) = false;
};

// One ReduceOnce: the relay's answer, a failed round as the call's status.
// Holds its --max_waiting_calls slot until it is answered and gRPC is done
// with it.
class UnaryRound final : public UnaryReactor {
 public:
  static void Start(ReduceOnceCall* call, std::shared_ptr<State> state) {
    auto round =
        std::shared_ptr<UnaryRound>(new UnaryRound(call, std::move(state)));
    round->self_ = round;
    UnaryRound* raw = round.get();
    State& s = *raw->state_;
    s.contributions.fetch_add(1, std::memory_order_relaxed);
    const v1::Contribution& request = call->request();
    const std::string authorization = Authorization(call->context());
    absl::Status refused =
        AdmitContribution(s.options.auth, authorization, request);
    if (refused.ok()) {
      refused = s.EnterWaiting();
      raw->admitted_ = refused.ok();
    }
    if (refused.ok()) {
      refused = CheckMessageSize(request.ByteSizeLong(), "a ReduceOnce request",
                                 s.options.max_message_bytes, "relay");
    }
    RefusingScope refusing;
    if (!refused.ok()) {
      raw->Answer(ErrorAnswer(KeyOf(request), refused));
    } else {
      // The relay's copy, made only once the request is taken.
      v1::Contribution c = request;
      DropUntrustedRoundAge(s.options.auth, authorization, c);
      s.relay.Contribute(std::move(c), [round](const RoundAnswer& answer) {
        round->Answer(answer);
      });
    }
  }

  ~UnaryRound() override {
    if (admitted_) state_->waiting.fetch_sub(1, std::memory_order_acq_rel);
    if (state_->options.guard != nullptr) state_->options.guard->CallReleased();
  }

  void OnCancel() override {
    if (Claim()) Finish(grpc::Status::CANCELLED);
  }
  void OnDone() override { self_.reset(); }

 private:
  UnaryRound(ReduceOnceCall* call, std::shared_ptr<State> state)
      : UnaryReactor(call),
        response_(call->response()),
        state_(std::move(state)) {
    if (state_->options.guard != nullptr) state_->options.guard->CallArrived();
  }

  void Answer(const RoundAnswer& answer) {
    state_->Counted(answer);
    if (!Claim()) return;
    if (!answer->result.has_error()) *response_ = answer->result;
    Finish(UnaryStatus(answer->result));
  }

  // True for the first caller only: Finish is called once.
  bool Claim() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finished_) return false;
    finished_ = true;
    return true;
  }

  v1::RoundResult* const response_;
  const std::shared_ptr<State> state_;
  bool admitted_ = false;             // set in Start
  std::shared_ptr<UnaryRound> self_;  // until OnDone
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// Requests each method keeps posted to gRPC: the calls gRPC can hand the
// loop at once, and so the connection guard's to judge. Calls past them
// wait in gRPC unseen (past its own bound of pending calls, it refuses
// them itself).
constexpr int kRequestsPosted = 16;

// Listens for `request`'s calls on `loop` and answers each UNIMPLEMENTED,
// naming where to send it. `keep` holds the listener for the calls.
template <typename Base, typename Req, typename Resp>
void ListenRefusing(
    RelayService* service, RpcLoop* loop,
    void (Base::*request)(grpc::ServerContext*, Req*,
                          grpc::ServerAsyncResponseWriter<Resp>*,
                          grpc::CompletionQueue*, grpc::ServerCompletionQueue*,
                          void*),
    const char* method_name, std::vector<std::shared_ptr<void>>& keep) {
  using Call = UnaryCall<Req, Resp>;
  auto method = std::make_shared<typename Call::Method>();
  method->request = Call::Requester(service, request);
  method->start = [method_name](Call* call) {
    call->Finish(grpc::Status(
        grpc::StatusCode::UNIMPLEMENTED,
        absl::StrCat("a relay serves rounds only (Reduce, ReduceOnce); send ",
                     method_name, " to the aggregator shards")));
  };
  for (int i = 0; i < kRequestsPosted; ++i) Call::Listen(loop, method.get());
  keep.push_back(std::move(method));
}

}  // namespace relay_service_internal

using relay_service_internal::ListenRefusing;
using relay_service_internal::ReduceStream;
using relay_service_internal::UnaryRound;

RelayService::RelayService(Relay& relay, RelayServiceOptions options)
    : state_(std::make_shared<State>(relay, std::move(options))) {
  const absl::Duration timeout = state_->options.stream_idle_timeout;
  if (timeout > absl::ZeroDuration()) {
    sweeper_ = std::make_unique<PeriodicThread>(
        std::clamp(timeout / 4, absl::Milliseconds(10), absl::Seconds(1)),
        [this] { CloseIdleStreams(); });
  }
}

RelayService::~RelayService() { sweeper_.reset(); }

void RelayService::Listen(RpcLoop* loop) {
  using A = v1::Aggregator::AsyncService;
  using Reduce = relay_service_internal::RawBidiCall;
  using ReduceOnce = relay_service_internal::ReduceOnceCall;
  auto reduce = std::make_shared<Reduce::Method>();
  reduce->request = Reduce::Requester(this, &RelayService::RequestReduce);
  reduce->start = [state = state_](Reduce* call) {
    ReduceStream::Start(call, state);
  };
  for (int i = 0; i < relay_service_internal::kRequestsPosted; ++i)
    Reduce::Listen(loop, reduce.get());
  methods_.push_back(std::move(reduce));
  auto once = std::make_shared<ReduceOnce::Method>();
  once->request = ReduceOnce::Requester(this, &A::RequestReduceOnce);
  once->start = [state = state_](ReduceOnce* call) {
    UnaryRound::Start(call, state);
  };
  for (int i = 0; i < relay_service_internal::kRequestsPosted; ++i)
    ReduceOnce::Listen(loop, once.get());
  methods_.push_back(std::move(once));

  std::vector<std::shared_ptr<void>>& keep = methods_;
  ListenRefusing(this, loop, &A::RequestCreateJob, "CreateJob", keep);
  ListenRefusing(this, loop, &A::RequestGetJob, "GetJob", keep);
  ListenRefusing(this, loop, &A::RequestDeleteJob, "DeleteJob", keep);
  ListenRefusing(this, loop, &A::RequestGetRunningStats, "GetRunningStats",
                 keep);
  ListenRefusing(this, loop, &A::RequestCheckpoint, "Checkpoint", keep);
  ListenRefusing(this, loop, &A::RequestListCheckpoints, "ListCheckpoints",
                 keep);
  ListenRefusing(this, loop, &A::RequestRestoreCheckpoint, "RestoreCheckpoint",
                 keep);
  ListenRefusing(this, loop, &A::RequestListJobs, "ListJobs", keep);
  ListenRefusing(this, loop, &A::RequestSetRunningStats, "SetRunningStats",
                 keep);
  ListenRefusing(this, loop, &A::RequestBackup, "Backup", keep);
  ListenRefusing(this, loop, &A::RequestListBackups, "ListBackups", keep);
  ListenRefusing(this, loop, &A::RequestRestoreBackup, "RestoreBackup", keep);
  ListenRefusing(this, loop, &A::RequestUpdateMembership, "UpdateMembership",
                 keep);
  ListenRefusing(this, loop, &A::RequestGetStatsHealth, "GetStatsHealth", keep);
}

void RelayService::CloseStreams() {
  sweeper_.reset();
  {
    absl::MutexLock lock(&state_->mu);
    state_->closed = true;
  }
  for (const std::shared_ptr<ReduceStream>& s : state_->Live()) {
    s->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the relay is shutting down; reconnect to a running "
                          "relay and resend what is unanswered"));
  }
}

int RelayService::CloseIdleStreams() {
  const absl::Duration timeout = state_->options.stream_idle_timeout;
  if (timeout <= absl::ZeroDuration()) return 0;
  const absl::Time now = absl::Now();
  int closed = 0;
  for (const std::shared_ptr<ReduceStream>& s : state_->Live()) {
    if (s->CloseIfIdle(now, timeout)) ++closed;
  }
  if (closed > 0) {
    state_->idle_closed.fetch_add(closed, std::memory_order_relaxed);
    LogLine("streams_idle_closed")
        .Add("streams", closed)
        .Add("idle_timeout_ms", absl::ToInt64Milliseconds(timeout));
  }
  return closed;
}

RelayServiceCounters RelayService::counters() const {
  RelayServiceCounters out;
  out.contributions = state_->contributions.load(std::memory_order_relaxed);
  for (int code = 0; code < 17; ++code) {
    out.answers[code] = state_->answers[code].load(std::memory_order_relaxed);
    out.refusals[code] = state_->refusals[code].load(std::memory_order_relaxed);
  }
  {
    absl::MutexLock lock(&state_->mu);
    out.open_streams = static_cast<int64_t>(state_->streams.size());
  }
  out.waiting_calls = state_->waiting.load(std::memory_order_acquire);
  out.held_bytes = state_->held_bytes.load(std::memory_order_relaxed);
  out.idle_streams_closed = state_->idle_closed.load(std::memory_order_relaxed);
  return out;
}

}  // namespace syncnorm
