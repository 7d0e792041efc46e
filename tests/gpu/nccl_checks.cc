// The device check's NCCL checks (see checks.h): the communicator
// (client/nccl_comm.h) and the node round protocol (client/nccl_round.h)
// between real NCCL ranks.
#include <cuda_runtime.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/nccl_comm.h"
#include "client/nccl_round.h"
#include "kernels/formulas.h"
#include "tests/gpu/checks.h"

namespace syncnorm::device_check {
namespace {

using nccl::Comm;
using nccl::CommResult;

constexpr int kChannels = 7;

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

const char* KindName(CommResult::Kind k) {
  switch (k) {
    case CommResult::kOk:
      return "ok";
    case CommResult::kInvalid:
      return "invalid";
    case CommResult::kTimeout:
      return "timeout";
    case CommResult::kAborted:
      return "aborted";
    case CommResult::kFailed:
      return "failed";
    case CommResult::kUnavailable:
      return "unavailable";
    case CommResult::kPeer:
      return "peer";
  }
  return "?";
}

std::string Describe(const CommResult& r) {
  return std::string(KindName(r.kind)) + (r.message.empty() ? "" : ": ") +
         r.message;
}

// Rank r's distinct values: element i is r * 1000 + i + 0.25 (exact).
std::vector<double> ValuesOf(int rank, size_t n) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = rank * 1000.0 + i + 0.25;
  return v;
}

// The collectives of one rank of `size`, checked element by element
// against what every rank sent; "" or what differed.
std::string CollectiveContent(Comm& comm) {
  const int size = comm.size();
  const int me = comm.rank();
  constexpr size_t kN = 1000;
  std::string bad;
  std::vector<double> all(kN * size);
  CommResult r = comm.AllGather(ValuesOf(me, kN).data(), all.data(), kN);
  if (!r.ok()) return "all-gather: " + Describe(r);
  for (int q = 0; q < size && bad.empty(); ++q) {
    const std::vector<double> want = ValuesOf(q, kN);
    for (size_t i = 0; i < kN; ++i) {
      if (all[q * kN + i] != want[i]) {
        bad = "all-gather: rank " + std::to_string(q) + " element " +
              std::to_string(i) + " = " + std::to_string(all[q * kN + i]);
        break;
      }
    }
  }
  std::vector<double> sum(kN);
  r = comm.AllReduceSum(ValuesOf(me, kN).data(), sum.data(), kN);
  if (!r.ok()) return "all-reduce: " + Describe(r);
  for (size_t i = 0; i < kN && bad.empty(); ++i) {
    double want = 0;
    for (int q = 0; q < size; ++q) want += ValuesOf(q, kN)[i];
    if (sum[i] != want) bad = "all-reduce: element " + std::to_string(i);
  }
  for (int root = 0; root < size && bad.empty(); ++root) {
    std::vector<double> buffer =
        me == root ? ValuesOf(100 + root, kN) : std::vector<double>(kN, -7.0);
    r = comm.Broadcast(buffer.data(), kN * sizeof(double), root);
    if (!r.ok()) return "broadcast: " + Describe(r);
    if (buffer != ValuesOf(100 + root, kN)) {
      bad = "broadcast from rank " + std::to_string(root) + " differs";
    }
  }
  return bad;
}

// The node round (forward) of one rank: every rank's counts and values
// arrive unchanged, and the rank-order Chan merge gives the same bits on
// every rank (returned as text for the caller to compare).
std::string NodeRoundContent(Comm& comm, std::string* merged_bits) {
  const int size = comm.size();
  const int me = comm.rank();
  nccl::NodeRound round(&comm);
  nccl::RoundEntry e;
  e.layer = 4;
  e.step = 9;
  e.count = me == 1 ? 0 : 100 + me;  // rank 1: an empty batch
  e.channels = kChannels;
  e.world_size = 12;
  std::vector<double> values = ValuesOf(me, 2 * kChannels);
  nccl::Gathered got;
  CommResult r = round.Gather(e, values.data(), &got);
  if (!r.ok()) return "gather: " + Describe(r);
  for (int q = 0; q < size; ++q) {
    if (got.counts[q] != (q == 1 ? 0 : 100 + q)) {
      return "gather: count of rank " + std::to_string(q);
    }
    const std::vector<double> want = ValuesOf(q, 2 * kChannels);
    for (int i = 0; i < 2 * kChannels; ++i) {
      if (got.values[q * 2 * kChannels + i] != want[i]) {
        return "gather: rank " + std::to_string(q) + " value " +
               std::to_string(i);
      }
    }
  }
  double n = 0;
  std::vector<double> mean(kChannels, 0.0), m2(kChannels, 0.0);
  for (int q = 0; q < size; ++q) {
    const double* v = got.values.data() + q * 2 * kChannels;
    for (int c = 0; c < kChannels; ++c) {
      double na = n;
      ChanMerge(na, mean[c], m2[c], static_cast<double>(got.counts[q]), v[c],
                v[kChannels + c]);
    }
    n += static_cast<double>(got.counts[q]);
  }
  std::ostringstream bits;
  bits.precision(17);
  for (int c = 0; c < kChannels; ++c) bits << mean[c] << "/" << m2[c] << " ";
  *merged_bits = bits.str();
  nccl::Outcome out;
  if (me == 0) {
    out.count = 12345;
    out.version = 77;
    out.payload = ValuesOf(50, 2 * kChannels);
    out.mask = {0x05, 0x08};               // ranks 0, 2, 11
    out.view = {{0, 9}, {3, 8}, {11, 7}};  // a stale answer's
  }
  r = round.Share(me == 0, &out);
  if (!r.ok()) return "share: " + Describe(r);
  if (out.code != 0 || out.count != 12345 || out.version != 77 ||
      out.payload != ValuesOf(50, 2 * kChannels) ||
      out.mask != std::vector<uint8_t>({0x05, 0x08}) ||
      out.view != std::vector<nccl::ViewEntry>({{0, 9}, {3, 8}, {11, 7}})) {
    return "share: the leader's outcome arrived changed";
  }
  return "";
}

// ---- ranks as threads
// ---------------------------------------------------------

int ThreadContent(int gpus) {
  std::string id;
  CommResult r = nccl::NewUniqueId(&id);
  if (!r.ok()) return Report(false, "ncclGetUniqueId", Describe(r));
  std::vector<std::string> bad(gpus), bits(gpus);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < gpus; ++rank) {
    threads.emplace_back([&, rank] {
      std::unique_ptr<Comm> comm;
      CommResult c = Comm::Create(id, gpus, rank, rank, 60000, &comm);
      if (!c.ok()) {
        bad[rank] = "create: " + Describe(c);
        return;
      }
      bad[rank] = CollectiveContent(*comm);
      if (bad[rank].empty()) bad[rank] = NodeRoundContent(*comm, &bits[rank]);
    });
  }
  for (std::thread& t : threads) t.join();
  std::string detail;
  for (int rank = 0; rank < gpus; ++rank) {
    if (!bad[rank].empty())
      detail += " rank " + std::to_string(rank) + ": " + bad[rank];
    if (bits[rank] != bits[0])
      detail += " rank " + std::to_string(rank) + " merged other bits";
  }
  return Report(detail.empty(),
                "NCCL with " + std::to_string(gpus) +
                    " rank(s) as threads: all-gather, all-reduce, broadcast "
                    "from every root and the node round, element by element",
                detail);
}

// The caller's current device is the same before and after Create, a
// collective and teardown; -1 means the current device.
int DeviceRestore(int gpus) {
  if (gpus < 2) {
    std::printf("SKIP the caller's device is restored: needs 2 GPUs\n");
    return 0;
  }
  std::string id;
  nccl::NewUniqueId(&id);
  cudaSetDevice(1);
  std::unique_ptr<Comm> comm;
  const CommResult c = Comm::Create(id, 1, 0, /*device=*/0, 30000, &comm);
  int after_create = -1, after_call = -1, after_teardown = -1;
  cudaGetDevice(&after_create);
  std::vector<double> v(4, 1.0), w(4);
  if (c.ok()) comm->AllGather(v.data(), w.data(), 4);
  cudaGetDevice(&after_call);
  comm.reset();
  cudaGetDevice(&after_teardown);
  std::string id2;
  nccl::NewUniqueId(&id2);
  std::unique_ptr<Comm> current;
  const CommResult d = Comm::Create(id2, 1, 0, /*device=*/-1, 30000, &current);
  const bool ok = c.ok() && d.ok() && after_create == 1 && after_call == 1 &&
                  after_teardown == 1 && current->device() == 1;
  cudaSetDevice(0);
  return Report(ok,
                "the caller's device is restored; device -1 is the current "
                "one",
                Describe(c) + "; devices after create/call/teardown: " +
                    std::to_string(after_create) + "/" +
                    std::to_string(after_call) + "/" +
                    std::to_string(after_teardown));
}

// A communicator whose second rank never comes fails with kTimeout (not
// any failure) within its timeout.
int MissingRankTimesOut() {
  std::string id;
  nccl::NewUniqueId(&id);
  std::unique_ptr<Comm> comm;
  const auto start = std::chrono::steady_clock::now();
  const CommResult r = Comm::Create(id, 2, 0, 0, 3000, &comm);
  const double s = Seconds(start);
  return Report(r.kind == CommResult::kTimeout && s < 13,
                "NCCL init with a missing rank fails as a timeout in time",
                std::to_string(s) + " s (timeout 3 s), " + Describe(r));
}

// Two ranks on one GPU in one process: refused as kInvalid, naming the
// one-rank-per-GPU rule.
int DuplicateGpuIsInvalid() {
  std::string id;
  nccl::NewUniqueId(&id);
  std::vector<CommResult> results(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      std::unique_ptr<Comm> comm;
      results[rank] = Comm::Create(id, 2, rank, 0, 20000, &comm);
    });
  }
  for (std::thread& t : threads) t.join();
  bool ok = true;
  for (const CommResult& r : results) {
    ok = ok && r.kind == CommResult::kInvalid &&
         r.message.find("one rank per GPU") != std::string::npos;
  }
  return Report(ok, "two ranks on one GPU in one process are kInvalid",
                Describe(results[0]) + " | " + Describe(results[1]));
}

// ---- one rank of two processes
// ---------------------------------------------------

// Rank 0 makes `count` ids and publishes them in `path`; rank 1 waits for
// them.
bool ShareIds(int rank, const std::string& path, int count,
              std::vector<std::string>* ids) {
  const size_t bytes = nccl::kUniqueIdBytes;
  if (rank == 0) {
    std::string all;
    for (int i = 0; i < count; ++i) {
      std::string id;
      if (!nccl::NewUniqueId(&id).ok()) return false;
      ids->push_back(id);
      all += id;
    }
    std::ofstream out(path + ".tmp", std::ios::binary);
    out.write(all.data(), static_cast<std::streamsize>(all.size()));
    out.close();
    return out && std::rename((path + ".tmp").c_str(), path.c_str()) == 0;
  }
  const auto start = std::chrono::steady_clock::now();
  while (Seconds(start) < 60) {
    std::ifstream in(path, std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    if (data.size() == count * bytes) {
      for (int i = 0; i < count; ++i)
        ids->push_back(data.substr(i * bytes, bytes));
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// The node round's verdicts between the two processes.
int RoundVerdicts(Comm& comm) {
  const int me = comm.rank();
  int failed = 0;
  nccl::NodeRound round(&comm);
  std::vector<double> v(2 * (kChannels + 1), 1.0);
  nccl::Gathered got;
  // Rank 1 says one channel more: kInvalid on both, naming it.
  nccl::RoundEntry e;
  e.layer = 1;
  e.step = 2;
  e.count = 5;
  e.world_size = 12;
  e.channels = me == 1 ? kChannels + 1 : kChannels;
  CommResult r = round.Gather(e, v.data(), &got);
  failed +=
      Report(r.kind == CommResult::kInvalid &&
                 r.message.find("local rank 1 is at forward layer 1 "
                                "step 2 with 8 channels") != std::string::npos,
             "a channel-count mismatch is kInvalid on this rank", Describe(r));
  // Rank 1 failed locally: both get its error (kPeer, its code).
  e.channels = kChannels;
  if (me == 1) {
    e.error_code = 3;  // INVALID_ARGUMENT
    e.error = "bad input on rank 1";
  }
  r = round.Gather(e, v.data(), &got);
  failed +=
      Report(r.kind == CommResult::kPeer && r.code == 3 &&
                 r.message.find("bad input on rank 1") != std::string::npos,
             "a peer's local failure reaches this rank with its code",
             Describe(r) + " code " + std::to_string(r.code));
  // The leader is slow upstream (6 s), past the timeout (4 s) but within
  // its budget (8 s): the other rank waits for it.
  e.error_code = 0;
  e.error.clear();
  e.upstream_ms = me == 0 ? 8000 : 0;
  r = round.Gather(e, v.data(), &got);
  nccl::Outcome out;
  if (me == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(6000));
    out.payload.assign(2 * kChannels, 2.0);
  }
  if (r.ok()) r = round.Share(me == 0, &out);
  failed += Report(
      r.ok() && out.payload == std::vector<double>(2 * kChannels, 2.0),
      "the other rank waits out the leader's upstream budget", Describe(r));
  return failed;
}

// Rank 0, after rank 1 died: the next call fails in time, later calls
// fail at once as aborted, and teardown returns.
int DeadPeer(std::unique_ptr<Comm> comm, int64_t timeout_ms) {
  int failed = 0;
  std::vector<double> v(4, 1.0), w(8);
  auto start = std::chrono::steady_clock::now();
  CommResult r = comm->AllGather(v.data(), w.data(), 4);
  double s = Seconds(start);
  // NCCL may see the dead peer itself (a remote error, kFailed) or not (the
  // deadline, kTimeout); either way in time, and nothing else.
  failed += Report(
      (r.kind == CommResult::kTimeout || r.kind == CommResult::kFailed) &&
          s < timeout_ms / 1000.0 + 5,
      "with its peer dead, a collective fails (timeout or "
      "remote error) in time",
      std::to_string(s) + " s, " + Describe(r));
  start = std::chrono::steady_clock::now();
  r = comm->Broadcast(v.data(), 32, 0);
  s = Seconds(start);
  failed += Report(r.kind == CommResult::kAborted && s < 1,
                   "later calls fail at once as aborted",
                   std::to_string(s) + " s, " + Describe(r));
  start = std::chrono::steady_clock::now();
  comm.reset();
  s = Seconds(start);
  failed += Report(s < timeout_ms / 1000.0 + 10, "teardown returns",
                   std::to_string(s) + " s");
  return failed;
}

}  // namespace

int RunNcclThreadChecks(int gpus) {
  int failed = ThreadContent(gpus);
  failed += DeviceRestore(gpus);
  failed += MissingRankTimesOut();
  failed += DuplicateGpuIsInvalid();
  return failed;
}

int RunNcclRank(int rank, const std::string& id_file, bool die) {
  // Two communicators: a patient one for the content, and one of 4 s for
  // the verdicts and the dead peer.
  constexpr int64_t kShortMs = 4000;
  std::vector<std::string> ids;
  if (!ShareIds(rank, id_file, 2, &ids)) {
    return Report(false, "rank " + std::to_string(rank) + ": the NCCL ids",
                  "not shared through " + id_file);
  }
  std::unique_ptr<Comm> comm, fast;
  // Device -1: the current one, device 0 in both processes (the old
  // default, local_rank, would have given rank 1 device 1).
  CommResult c = Comm::Create(ids[0], 2, rank, -1, 60000, &comm);
  int failed = Report(
      c.ok() && comm->device() == 0,
      "rank " + std::to_string(rank) + " joins on the current device (0)",
      Describe(c));
  if (!c.ok()) return failed;
  std::string bad = CollectiveContent(*comm);
  failed += Report(bad.empty(),
                   "two processes: all-gather, all-reduce, broadcast from "
                   "each root, element by element",
                   bad);
  std::string bits;
  bad = NodeRoundContent(*comm, &bits);
  failed += Report(bad.empty(),
                   "two processes: the node round's gather and the leader's "
                   "outcome, element by element",
                   bad);
  std::printf("MERGED %s\n", bits.c_str());  // compared across the ranks
  comm.reset();                              // both alive: a clean teardown
  c = Comm::Create(ids[1], 2, rank, -1, kShortMs, &fast);
  failed += Report(c.ok(), "a second communicator (4 s timeout)", Describe(c));
  if (!c.ok()) return failed;
  failed += RoundVerdicts(*fast);
  if (rank == 1) {
    if (die) {
      std::fflush(stdout);
      _exit(failed == 0 ? 0 : 1);  // no teardown: a dead peer
    }
    return failed;
  }
  return failed + DeadPeer(std::move(fast), kShortMs);
}

}  // namespace syncnorm::device_check
