#include "client/nccl_node_group.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "client/nccl_comm.h"

namespace syncnorm {
namespace {

constexpr char kIdFileMagic[] = "syncnorm-nccl-id-v1";

absl::Status ToStatus(const nccl::CommResult& r) {
  switch (r.kind) {
    case nccl::CommResult::kOk:
      return absl::OkStatus();
    case nccl::CommResult::kInvalid:
      return absl::InvalidArgumentError(r.message);
    case nccl::CommResult::kTimeout:
      return absl::DeadlineExceededError(r.message);
    case nccl::CommResult::kAborted:
      return absl::FailedPreconditionError(r.message);
    case nccl::CommResult::kUnavailable:
      return absl::FailedPreconditionError(r.message);
    case nccl::CommResult::kFailed:
    default:
      return absl::InternalError(r.message);
  }
}

// The leader's outcome as it travels in a broadcast, ahead of the payload.
struct OutcomeHeader {
  int64_t code;
  int64_t ints[2];
  char message[496];
};

// Per-rank record of the forward all-gather: layer, step, count, channels,
// then mean[C] and m2[C].
constexpr int kForwardHeader = 4;

// A forward result's missing ranks travel as a mask of world_size bits
// (rank r: bit r % 8 of byte r / 8): its size is fixed by the job, so the
// other local ranks know the broadcast's size before it arrives.
std::vector<uint8_t> EmptyRankMask(int world_size) {
  return std::vector<uint8_t>((static_cast<size_t>(world_size) + 7) / 8, 0);
}

// Sets the bits of `ranks`; INTERNAL when one is outside [0, world_size).
absl::Status MaskRanks(const std::vector<int>& ranks, int world_size,
                       std::vector<uint8_t>& mask) {
  for (int r : ranks) {
    if (r < 0 || r >= world_size) {
      return absl::InternalError(absl::StrCat(
          "the aggregator named missing rank ", r, ", outside the job's ",
          world_size, " ranks (NcclNodeGroupOptions::world_size)"));
    }
    mask[r / 8] |= static_cast<uint8_t>(1u << (r % 8));
  }
  return absl::OkStatus();
}

// The ranks of a mask, ascending.
std::vector<int> RanksOf(const std::vector<uint8_t>& mask) {
  std::vector<int> ranks;
  for (size_t byte = 0; byte < mask.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      if (mask[byte] & (1u << bit)) ranks.push_back(byte * 8 + bit);
    }
  }
  return ranks;
}

}  // namespace

FileUniqueIdExchange::FileUniqueIdExchange(std::string path,
                                           std::string session)
    : path_(std::move(path)), session_(std::move(session)) {}

absl::Status FileUniqueIdExchange::Publish(const std::string& id) {
  const std::string tmp = absl::StrCat(path_, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kIdFileMagic << "\n"
        << session_ << "\n"
        << absl::BytesToHexString(id) << "\n";
    out.close();
    if (!out) {
      return absl::UnavailableError(absl::StrCat(
          "cannot write the NCCL id to ", tmp, "; check the path"));
    }
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot move the NCCL id file into place at ", path_, ": ",
        std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileUniqueIdExchange::Fetch(
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::ifstream in(path_);
    std::string magic, session, hex;
    if (in && std::getline(in, magic) && std::getline(in, session) &&
        std::getline(in, hex) && magic == kIdFileMagic &&
        session == session_) {
      const std::string id = absl::HexStringToBytes(hex);
      if (id.size() == nccl::kUniqueIdBytes) return id;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "local rank 0 did not publish the NCCL id for session '", session_,
          "' at ", path_, " within ", absl::FormatDuration(timeout),
          "; is local rank 0 running with the same path and session?"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::StatusOr<std::unique_ptr<NcclNodeGroup>> NcclNodeGroup::Create(
    const NcclNodeGroupOptions& options, UniqueIdExchange& exchange,
    std::unique_ptr<NodeGroup> upstream) {
  if (options.local_size < 1 || options.local_rank < 0 ||
      options.local_rank >= options.local_size ||
      options.timeout <= absl::ZeroDuration() || options.world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclNodeGroup: need 0 <= local_rank < local_size, a positive "
        "timeout and the job's world_size (>= 1); got local_rank ",
        options.local_rank, ", local_size ", options.local_size,
        ", world_size ", options.world_size));
  }
  const bool leader = options.local_rank == 0;
  if (leader && upstream == nullptr) {
    return absl::InvalidArgumentError(
        "NcclNodeGroup: local rank 0 is the node leader and needs an "
        "upstream group (say, a SoloNodeGroup) to reach the aggregator");
  }
  std::string id;
  if (leader) {
    absl::Status s = ToStatus(nccl::NewUniqueId(&id));
    if (s.ok()) s = exchange.Publish(id);
    if (!s.ok()) return s;
  } else {
    absl::StatusOr<std::string> fetched = exchange.Fetch(options.timeout);
    if (!fetched.ok()) return fetched.status();
    id = *std::move(fetched);
  }
  const int device =
      options.cuda_device < 0 ? options.local_rank : options.cuda_device;
  std::unique_ptr<nccl::Comm> comm;
  absl::Status s = ToStatus(nccl::Comm::Create(
      id, options.local_size, options.local_rank, device,
      absl::ToInt64Milliseconds(options.timeout), &comm));
  if (!s.ok()) return s;
  return std::unique_ptr<NcclNodeGroup>(
      new NcclNodeGroup(options, std::move(upstream), std::move(comm)));
}

NcclNodeGroup::NcclNodeGroup(const NcclNodeGroupOptions& options,
                             std::unique_ptr<NodeGroup> upstream,
                             std::unique_ptr<nccl::Comm> comm)
    : options_(options),
      upstream_(std::move(upstream)),
      comm_(std::move(comm)) {}

NcclNodeGroup::~NcclNodeGroup() = default;

absl::Status NcclNodeGroup::ShareOutcome(const absl::Status& leader_status,
                                         int64_t* ints,
                                         std::vector<double>& payload,
                                         std::vector<uint8_t>& mask) {
  const bool leader = options_.local_rank == 0;
  const size_t payload_bytes = payload.size() * sizeof(double);
  std::vector<char> buffer(sizeof(OutcomeHeader) + payload_bytes +
                           mask.size());
  OutcomeHeader header{};
  if (leader) {
    header.code = static_cast<int64_t>(leader_status.code());
    header.ints[0] = ints[0];
    header.ints[1] = ints[1];
    const std::string message(leader_status.message());
    std::strncpy(header.message, message.c_str(), sizeof(header.message) - 1);
    std::memcpy(buffer.data(), &header, sizeof(header));
    std::memcpy(buffer.data() + sizeof(header), payload.data(),
                payload_bytes);
    std::memcpy(buffer.data() + sizeof(header) + payload_bytes, mask.data(),
                mask.size());
  }
  absl::Status s =
      ToStatus(comm_->Broadcast(buffer.data(), buffer.size(), /*root=*/0));
  if (!s.ok()) return s;
  if (leader) return leader_status;
  std::memcpy(&header, buffer.data(), sizeof(header));
  header.message[sizeof(header.message) - 1] = '\0';
  if (header.code != 0) {
    return absl::Status(
        static_cast<absl::StatusCode>(header.code),
        absl::StrCat("the node leader (local rank 0) failed this round: ",
                     header.message));
  }
  ints[0] = header.ints[0];
  ints[1] = header.ints[1];
  std::memcpy(payload.data(), buffer.data() + sizeof(header), payload_bytes);
  std::memcpy(mask.data(), buffer.data() + sizeof(header) + payload_bytes,
              mask.size());
  return absl::OkStatus();
}

absl::StatusOr<ForwardReply> NcclNodeGroup::SyncForward(int layer,
                                                        int64_t step,
                                                        const Moments& local) {
  absl::MutexLock lock(&mu_);
  const int channels = local.channels();
  const size_t record = kForwardHeader + 2 * static_cast<size_t>(channels);
  std::vector<double> send(record);
  send[0] = layer;
  send[1] = static_cast<double>(step);
  send[2] = static_cast<double>(local.count);
  send[3] = channels;
  std::copy(local.mean.begin(), local.mean.end(), send.begin() + 4);
  std::copy(local.m2.begin(), local.m2.end(), send.begin() + 4 + channels);
  const int size = options_.local_size;
  std::vector<double> all(record * size);
  absl::Status s = ToStatus(comm_->AllGather(send.data(), all.data(), record));
  if (!s.ok()) return s;
  // Every rank sees the same gathered records, so every rank reaches the
  // same verdict and folds the same values in the same (local-rank) order.
  Moments merged = Moments::Zero(channels);
  for (int r = 0; r < size; ++r) {
    const double* p = all.data() + r * record;
    if (p[0] != all[0] || p[1] != all[1] || p[3] != all[3]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the local ranks of this node are not in the same round: local "
          "rank ", r, " is at layer ", p[0], " step ", p[1], " with ", p[3],
          " channels, local rank 0 at layer ", all[0], " step ", all[1],
          " with ", all[3]));
    }
    Moments part;
    part.count = static_cast<int64_t>(p[2]);
    part.mean.assign(p + 4, p + 4 + channels);
    part.m2.assign(p + 4 + channels, p + 4 + 2 * channels);
    MergeMoments(merged, part);
  }
  int64_t ints[2] = {0, 0};
  std::vector<double> payload(2 * static_cast<size_t>(channels));
  std::vector<uint8_t> mask = EmptyRankMask(options_.world_size);
  absl::Status leader_status;
  if (options_.local_rank == 0) {
    absl::StatusOr<ForwardReply> reply =
        upstream_->SyncForward(layer, step, merged);
    leader_status = reply.status();
    if (reply.ok() && (reply->global.mean.size() != payload.size() / 2 ||
                       reply->global.var.size() != payload.size() / 2)) {
      leader_status = absl::InternalError(
          "the aggregator answered with a different channel count");
    }
    if (leader_status.ok()) {
      ints[0] = reply->global.count;
      ints[1] = reply->version;
      std::copy(reply->global.mean.begin(), reply->global.mean.end(),
                payload.begin());
      std::copy(reply->global.var.begin(), reply->global.var.end(),
                payload.begin() + channels);
      leader_status =
          MaskRanks(reply->missing_ranks, options_.world_size, mask);
    }
  }
  s = ShareOutcome(leader_status, ints, payload, mask);
  if (!s.ok()) return s;
  // The leader too builds its reply from what it broadcast: the same reply
  // on every local rank.
  ForwardReply out;
  out.global.count = ints[0];
  out.version = ints[1];
  out.global.mean.assign(payload.begin(), payload.begin() + channels);
  out.global.var.assign(payload.begin() + channels, payload.end());
  out.missing_ranks = RanksOf(mask);
  return out;
}

absl::StatusOr<GradSums> NcclNodeGroup::SyncBackward(int layer, int64_t step,
                                                     const GradSums& local) {
  absl::MutexLock lock(&mu_);
  const int channels = local.channels();
  std::vector<double> send(2 * static_cast<size_t>(channels));
  std::copy(local.sum_dy.begin(), local.sum_dy.end(), send.begin());
  std::copy(local.sum_dy_xmu.begin(), local.sum_dy_xmu.end(),
            send.begin() + channels);
  std::vector<double> summed(send.size());
  absl::Status s =
      ToStatus(comm_->AllReduceSum(send.data(), summed.data(), send.size()));
  if (!s.ok()) return s;
  int64_t ints[2] = {0, 0};
  std::vector<double> payload(send.size());
  absl::Status leader_status;
  if (options_.local_rank == 0) {
    GradSums node;
    node.sum_dy.assign(summed.begin(), summed.begin() + channels);
    node.sum_dy_xmu.assign(summed.begin() + channels, summed.end());
    absl::StatusOr<GradSums> global =
        upstream_->SyncBackward(layer, step, node);
    leader_status = global.status();
    if (global.ok() && global->channels() != channels) {
      leader_status = absl::InternalError(
          "the aggregator answered with a different channel count");
    }
    if (leader_status.ok()) {
      std::copy(global->sum_dy.begin(), global->sum_dy.end(), payload.begin());
      std::copy(global->sum_dy_xmu.begin(), global->sum_dy_xmu.end(),
                payload.begin() + channels);
    }
  }
  std::vector<uint8_t> no_mask;
  s = ShareOutcome(leader_status, ints, payload, no_mask);
  if (!s.ok()) return s;
  GradSums out;
  out.sum_dy.assign(payload.begin(), payload.begin() + channels);
  out.sum_dy_xmu.assign(payload.begin() + channels, payload.end());
  return out;
}

}  // namespace syncnorm
