// nccl_comm.h for tests without GPUs: the ranks of a communicator are
// threads of this process, and a collective is done by the last rank to
// enter it, on every rank's host buffers. It keeps the contract of the real
// one that NcclNodeGroup relies on: ranks meet by id, every rank must issue
// the same collectives in the same order, a collective that outlives its
// deadline fails with kTimeout, and after any failure the communicator is
// aborted and every later call fails with kAborted. Where NCCL promises
// nothing, the fake does not help either: collectives of different kinds
// or sizes (undefined behavior in NCCL: a hang or corrupt memory) fail as
// kFailed, never as a clean kInvalid, and the all-reduce sums the ranks in
// reverse order, so that code relying on an order NCCL does not give shows
// it. It has no devices: Comm::device() is what Create was given.
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/nccl_comm.h"

namespace syncnorm {
namespace nccl {
namespace {

enum class Op { kAllGather, kAllReduceSum, kBroadcast };

// What one rank brought to the collective in progress.
struct Entry {
  Op op;
  const void* send;
  void* recv;
  size_t count;  // doubles, or bytes for kBroadcast
  int root;
};

// The ranks of one communicator (one id).
struct Hub {
  explicit Hub(int size) : size(size), entries(size) {}

  const int size;  // constant after construction

  absl::Mutex mu;
  int joined ABSL_GUARDED_BY(mu) = 0;
  int arrived ABSL_GUARDED_BY(mu) = 0;
  // Collectives done so far; a rank waits for its own to be counted.
  int64_t done ABSL_GUARDED_BY(mu) = 0;
  std::vector<Entry> entries ABSL_GUARDED_BY(mu);
  // Set by the first failure; every later call fails with it.
  CommResult failure ABSL_GUARDED_BY(mu);
};

// Communicators by id. Test-only, so a process-wide table is acceptable:
// it is how the ranks (threads) find each other, as NCCL's id does.
struct Registry {
  absl::Mutex mu;
  std::map<std::string, std::weak_ptr<Hub>> hubs ABSL_GUARDED_BY(mu);
};

Registry& TheRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

// Does the collective of every rank's entry; false when they disagree.
bool Run(std::vector<Entry>& e) {
  const int size = static_cast<int>(e.size());
  for (const Entry& x : e) {
    if (x.op != e[0].op || x.count != e[0].count || x.root != e[0].root) {
      return false;
    }
  }
  const size_t n = e[0].count;
  for (int r = 0; r < size; ++r) {
    switch (e[0].op) {
      case Op::kAllGather:
        for (int from = 0; from < size; ++from) {
          std::memcpy(static_cast<double*>(e[r].recv) + from * n, e[from].send,
                      n * sizeof(double));
        }
        break;
      case Op::kAllReduceSum: {
        auto* out = static_cast<double*>(e[r].recv);
        for (size_t i = 0; i < n; ++i) {
          double sum = 0;  // not in rank order (NCCL gives no order)
          for (int from = size - 1; from >= 0; --from) {
            sum += static_cast<const double*>(e[from].send)[i];
          }
          out[i] = sum;
        }
        break;
      }
      case Op::kBroadcast:
        if (r != e[0].root) {
          std::memcpy(e[r].recv, e[e[0].root].send, n);
        }
        break;
    }
  }
  return true;
}

}  // namespace

struct Comm::State {
  std::shared_ptr<Hub> hub;
  int rank = 0;
  int device = 0;
  int64_t timeout_ms = 0;

  // Waits at most timeout_ms + extra_ms for the other ranks.
  CommResult Collective(const Entry& mine, int64_t extra_ms = 0);
};

CommResult Comm::State::Collective(const Entry& mine, int64_t extra_ms) {
  Hub& h = *hub;
  absl::MutexLock lock(&h.mu);
  if (!h.failure.ok()) {
    return CommResult{CommResult::kAborted,
                      "the communicator was aborted after an earlier "
                      "failure: " +
                          h.failure.message};
  }
  h.entries[rank] = mine;
  const int64_t ticket = h.done;
  if (++h.arrived == h.size) {
    h.arrived = 0;
    if (Run(h.entries)) {
      ++h.done;
      return CommResult{};
    }
    h.failure = CommResult{CommResult::kFailed,
                           "the ranks issued collectives of different kinds "
                           "or sizes (undefined behavior in NCCL)"};
    return h.failure;
  }
  auto finished = [&h, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(h.mu) {
    return h.done != ticket || !h.failure.ok();
  };
  if (!h.mu.AwaitWithTimeout(absl::Condition(&finished),
                             absl::Milliseconds(timeout_ms + extra_ms))) {
    h.failure = CommResult{
        CommResult::kTimeout,
        absl::StrCat("rank ", rank, ": a collective waited more than ",
                     timeout_ms + extra_ms, " ms for its peers")};
  }
  return h.done != ticket ? CommResult{} : h.failure;
}

CommResult NewUniqueId(std::string* id) {
  static absl::Mutex* mu = new absl::Mutex;
  static int64_t next = 0;
  absl::MutexLock lock(mu);
  *id = absl::StrCat("fake-nccl-id-", ++next);
  id->resize(kUniqueIdBytes, '\0');
  return CommResult{};
}

Comm::Comm(std::unique_ptr<State> state) : state_(std::move(state)) {}
Comm::~Comm() = default;
int Comm::size() const { return state_->hub->size; }
int Comm::rank() const { return state_->rank; }
int Comm::device() const { return state_->device; }

bool Comm::aborted() const {
  absl::MutexLock lock(&state_->hub->mu);
  return !state_->hub->failure.ok();
}

CommResult Comm::Create(const std::string& id, int size, int rank, int device,
                        int64_t timeout_ms, std::unique_ptr<Comm>* out) {
  if (size < 1 || rank < 0 || rank >= size || timeout_ms <= 0) {
    return CommResult{CommResult::kInvalid,
                      absl::StrCat("bad rank ", rank, " of ", size)};
  }
  std::shared_ptr<Hub> hub;
  {
    Registry& registry = TheRegistry();
    absl::MutexLock lock(&registry.mu);
    hub = registry.hubs[id].lock();
    if (hub == nullptr) {
      hub = std::make_shared<Hub>(size);
      registry.hubs[id] = hub;
    }
  }
  {
    absl::MutexLock lock(&hub->mu);
    if (hub->size != size) {
      return CommResult{CommResult::kInvalid, "ranks disagree on the size"};
    }
    ++hub->joined;
    auto all = [&hub]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(hub->mu) {
      return hub->joined == hub->size;
    };
    if (!hub->mu.AwaitWithTimeout(absl::Condition(&all),
                                  absl::Milliseconds(timeout_ms))) {
      return CommResult{
          CommResult::kTimeout,
          absl::StrCat("only ", hub->joined, " of ", size, " ranks joined")};
    }
  }
  auto state = std::make_unique<State>();
  state->hub = std::move(hub);
  state->rank = rank;
  state->device = device;
  state->timeout_ms = timeout_ms;
  out->reset(new Comm(std::move(state)));
  return CommResult{};
}

CommResult Comm::AllGather(const double* send, double* recv, size_t count) {
  return state_->Collective(Entry{Op::kAllGather, send, recv, count, 0});
}

CommResult Comm::AllReduceSum(const double* send, double* recv, size_t count) {
  return state_->Collective(Entry{Op::kAllReduceSum, send, recv, count, 0});
}

CommResult Comm::Broadcast(void* buffer, size_t bytes, int root,
                           int64_t extra_ms) {
  return state_->Collective(Entry{Op::kBroadcast, buffer, buffer, bytes, root},
                            extra_ms);
}

}  // namespace nccl
}  // namespace syncnorm
