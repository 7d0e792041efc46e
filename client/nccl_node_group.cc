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

// A status from a code that traveled between local ranks.
absl::Status CodeStatus(int code, const std::string& message) {
  if (code <= 0 ||
      code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(message);
  }
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

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
    case nccl::CommResult::kPeer:
      return CodeStatus(r.code, r.message);
    case nccl::CommResult::kFailed:
    default:
      return absl::InternalError(r.message);
  }
}

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

// A view as the round carries it (nccl::Outcome::view). INTERNAL when the
// aggregator broke its contract (ranks ascending, within [0, world_size)),
// which also bounds the view by world_size entries.
absl::Status ToRoundView(const std::vector<ForwardReply::ViewEntry>& view,
                         int world_size, std::vector<nccl::ViewEntry>& out) {
  int last = -1;
  for (const ForwardReply::ViewEntry& e : view) {
    if (e.rank <= last || e.rank >= world_size) {
      out.clear();
      return absl::InternalError(absl::StrCat(
          "the aggregator's view names rank ", e.rank, " after rank ", last,
          "; a view names each rank of the job's ", world_size,
          " (NcclNodeGroupOptions::world_size) at most once, ascending"));
    }
    last = e.rank;
    out.push_back(nccl::ViewEntry{e.rank, e.step});
  }
  return absl::OkStatus();
}

// The view a round carried, as ForwardReply has it.
std::vector<ForwardReply::ViewEntry> FromRoundView(
    const std::vector<nccl::ViewEntry>& view) {
  std::vector<ForwardReply::ViewEntry> out;
  out.reserve(view.size());
  for (const nccl::ViewEntry& e : view) {
    out.push_back(ForwardReply::ViewEntry{static_cast<int>(e.rank), e.step});
  }
  return out;
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
      return absl::UnavailableError(absl::StrCat("cannot write the NCCL id to ",
                                                 tmp, "; check the path"));
    }
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot move the NCCL id file into place at ", path_, ": ",
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
        std::getline(in, hex) && magic == kIdFileMagic && session == session_) {
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
      options.timeout <= absl::ZeroDuration() ||
      options.upstream_timeout < absl::ZeroDuration() ||
      options.world_size < 1 || options.cuda_device < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclNodeGroup: need 0 <= local_rank < local_size, a positive "
        "timeout, upstream_timeout >= 0, cuda_device >= -1 and the job's "
        "world_size (>= 1); got local_rank ",
        options.local_rank, ", local_size ", options.local_size,
        ", world_size ", options.world_size, ", cuda_device ",
        options.cuda_device));
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
  std::unique_ptr<nccl::Comm> comm;
  absl::Status s = ToStatus(nccl::Comm::Create(
      id, options.local_size, options.local_rank, options.cuda_device,
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
      comm_(std::move(comm)),
      round_(comm_.get()) {}

NcclNodeGroup::~NcclNodeGroup() = default;

nccl::RoundEntry NcclNodeGroup::Entry(nccl::Phase phase, int layer,
                                      int64_t step, int backward,
                                      int channels) const {
  nccl::RoundEntry e;
  e.phase = phase;
  e.layer = layer;
  e.step = step;
  e.backward_index = backward;
  e.channels = channels;
  e.world_size = options_.world_size;
  if (leader()) {
    e.upstream_ms = absl::ToInt64Milliseconds(options_.upstream_timeout);
  }
  return e;
}

absl::Status NcclNodeGroup::Share(const absl::Status& leader_status,
                                  nccl::Outcome* out) {
  if (leader()) {
    out->code = static_cast<int>(leader_status.code());
    out->message = std::string(leader_status.message());
  }
  absl::Status s = ToStatus(round_.Share(leader(), out));
  if (!s.ok()) return s;
  if (leader()) return leader_status;
  if (out->code == 0) return absl::OkStatus();
  return CodeStatus(out->code, absl::StrCat("the node leader (local rank 0) "
                                            "failed this round: ",
                                            out->message));
}

absl::Status NcclNodeGroup::LeaderForward(int layer, int64_t step,
                                          const Moments& merged,
                                          nccl::Outcome* out) {
  const int channels = merged.channels();
  absl::StatusOr<ForwardReply> reply =
      upstream_->SyncForward(layer, step, merged);
  if (!reply.ok()) return reply.status();
  if (reply->global.mean.size() != static_cast<size_t>(channels) ||
      reply->global.var.size() != static_cast<size_t>(channels)) {
    return absl::InternalError(
        "the aggregator answered with a different channel count");
  }
  out->count = reply->global.count;
  out->version = reply->version;
  std::copy(reply->global.mean.begin(), reply->global.mean.end(),
            out->payload.begin());
  std::copy(reply->global.var.begin(), reply->global.var.end(),
            out->payload.begin() + channels);
  absl::Status s =
      MaskRanks(reply->missing_ranks, options_.world_size, out->mask);
  if (!s.ok()) return s;
  // A stale answer's view goes to every local rank, so that each layer
  // flags its running statistics as behind instead of mirroring the
  // view's merge. Set last: an error outcome carries no view.
  return ToRoundView(reply->view, options_.world_size, out->view);
}

absl::StatusOr<ForwardReply> NcclNodeGroup::SyncForward(int layer, int64_t step,
                                                        const Moments& local) {
  absl::MutexLock lock(&mu_);
  const int channels = local.channels();
  nccl::RoundEntry entry =
      Entry(nccl::Phase::kForward, layer, step, /*backward=*/0, channels);
  entry.count = local.count;
  std::vector<double> values(local.mean);
  values.insert(values.end(), local.m2.begin(), local.m2.end());
  nccl::Gathered all;
  absl::Status s = ToStatus(round_.Gather(entry, values.data(), &all));
  if (!s.ok()) return s;
  // Every rank folds the same values in the same (local-rank) order.
  Moments merged = Moments::Zero(channels);
  for (int r = 0; r < options_.local_size; ++r) {
    const double* p = all.values.data() + 2 * static_cast<size_t>(r) * channels;
    Moments part;
    part.count = all.counts[r];
    part.mean.assign(p, p + channels);
    part.m2.assign(p + channels, p + 2 * channels);
    MergeMoments(merged, part);
  }
  nccl::Outcome out;
  out.payload.assign(2 * static_cast<size_t>(channels), 0.0);
  out.mask = EmptyRankMask(options_.world_size);
  const absl::Status leader_status =
      leader() ? LeaderForward(layer, step, merged, &out) : absl::OkStatus();
  s = Share(leader_status, &out);
  if (!s.ok()) return s;
  // The leader too builds its reply from what it broadcast: the same reply
  // on every local rank.
  ForwardReply reply;
  reply.global.count = out.count;
  reply.version = out.version;
  reply.global.mean.assign(out.payload.begin(), out.payload.begin() + channels);
  reply.global.var.assign(out.payload.begin() + channels, out.payload.end());
  reply.missing_ranks = RanksOf(out.mask);
  reply.view = FromRoundView(out.view);
  return reply;
}

absl::StatusOr<GradSums> NcclNodeGroup::SyncBackward(int layer, int64_t step,
                                                     int backward,
                                                     const GradSums& local) {
  absl::MutexLock lock(&mu_);
  const int channels = local.channels();
  std::vector<double> values(local.sum_dy);
  values.insert(values.end(), local.sum_dy_xmu.begin(), local.sum_dy_xmu.end());
  nccl::Gathered all;
  absl::Status s = ToStatus(round_.Gather(
      Entry(nccl::Phase::kBackward, layer, step, backward, channels),
      values.data(), &all));
  if (!s.ok()) return s;
  // Summed on the host in local-rank order (an all-reduce has no fixed
  // order), as ThreadNode sums: the same bits on every rank and node kind.
  GradSums node;
  node.sum_dy.assign(channels, 0.0);
  node.sum_dy_xmu.assign(channels, 0.0);
  for (int r = 0; r < options_.local_size; ++r) {
    const double* p = all.values.data() + 2 * static_cast<size_t>(r) * channels;
    GradSums part;
    part.sum_dy.assign(p, p + channels);
    part.sum_dy_xmu.assign(p + channels, p + 2 * channels);
    AddGradSums(node, part);
  }
  nccl::Outcome out;
  out.payload.assign(2 * static_cast<size_t>(channels), 0.0);
  absl::Status leader_status;
  if (leader()) {
    absl::StatusOr<GradSums> global =
        upstream_->SyncBackward(layer, step, backward, node);
    leader_status = global.status();
    if (global.ok() && global->channels() != channels) {
      leader_status = absl::InternalError(
          "the aggregator answered with a different channel count");
    }
    if (leader_status.ok()) {
      std::copy(global->sum_dy.begin(), global->sum_dy.end(),
                out.payload.begin());
      std::copy(global->sum_dy_xmu.begin(), global->sum_dy_xmu.end(),
                out.payload.begin() + channels);
    }
  }
  s = Share(leader_status, &out);
  if (!s.ok()) return s;
  GradSums reply;
  reply.sum_dy.assign(out.payload.begin(), out.payload.begin() + channels);
  reply.sum_dy_xmu.assign(out.payload.begin() + channels, out.payload.end());
  return reply;
}

absl::Status NcclNodeGroup::FailForward(int layer, int64_t step,
                                        const absl::Status& error) {
  absl::MutexLock lock(&mu_);
  nccl::RoundEntry entry =
      Entry(nccl::Phase::kForward, layer, step, /*backward=*/0, 0);
  entry.error_code = static_cast<int>(error.code());
  entry.error = std::string(error.message());
  nccl::Gathered unused;
  round_.Gather(entry, nullptr, &unused);  // every rank fails the round
  return error;
}

absl::Status NcclNodeGroup::FailBackward(int layer, int64_t step, int backward,
                                         const absl::Status& error) {
  absl::MutexLock lock(&mu_);
  nccl::RoundEntry entry =
      Entry(nccl::Phase::kBackward, layer, step, backward, 0);
  entry.error_code = static_cast<int>(error.code());
  entry.error = std::string(error.message());
  nccl::Gathered unused;
  round_.Gather(entry, nullptr, &unused);
  return error;
}

}  // namespace syncnorm
