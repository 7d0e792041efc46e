#include "client/nccl_round.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace syncnorm {
namespace nccl {
namespace {

// "snround3": version 2 carries a view after the outcome (ShareView),
// version 3 the backward index in the header.
constexpr int64_t kMagic = 0x736e726f756e6433;

// A header as it travels: 512 bytes, all-gathered as 64 doubles.
struct WireHeader {
  int64_t magic;
  int64_t phase;
  int64_t layer;
  int64_t step;
  int64_t count;
  int64_t channels;
  int64_t world_size;
  int64_t upstream_ms;
  int64_t error_code;
  int64_t backward_index;
  char error[432];  // NUL-terminated
};
static_assert(sizeof(WireHeader) == 512, "a fixed header size");
constexpr size_t kHeaderDoubles = sizeof(WireHeader) / sizeof(double);

// The leader's outcome as it travels, ahead of the payload and mask.
struct WireOutcome {
  int64_t code;
  int64_t count;
  int64_t version;
  int64_t view_size;  // entries of the view broadcast that follows; 0: none
  char message[480];  // NUL-terminated
};
static_assert(sizeof(WireOutcome) == 512, "a fixed outcome size");

// A view entry as it travels: rank, then step.
constexpr size_t kViewEntryInts = 2;

void CopyText(const std::string& text, char* out, size_t size) {
  const size_t n = std::min(text.size(), size - 1);
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

std::string Text(const char* text, size_t size) {
  return std::string(text, strnlen(text, size));
}

const char* PhaseName(int64_t phase) {
  return phase == static_cast<int64_t>(Phase::kForward)    ? "forward"
         : phase == static_cast<int64_t>(Phase::kBackward) ? "backward"
                                                           : "unknown";
}

std::string Where(const WireHeader& h) {
  const std::string backward =
      h.phase == static_cast<int64_t>(Phase::kBackward)
          ? " backward " + std::to_string(h.backward_index)
          : "";
  return std::string(PhaseName(h.phase)) + " layer " + std::to_string(h.layer) +
         " step " + std::to_string(h.step) + backward + " with " +
         std::to_string(h.channels) + " channels and world_size " +
         std::to_string(h.world_size);
}

CommResult Invalid(std::string message) {
  return CommResult{CommResult::kInvalid, std::move(message)};
}

// The verdict every rank reaches from the same headers.
CommResult Verdict(const std::vector<WireHeader>& all, int me) {
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].magic != kMagic) {
      return Invalid("local rank " + std::to_string(r) +
                     " did not send a syncnorm round header: it called a "
                     "different collective, or runs another version");
    }
  }
  for (size_t r = 0; r < all.size(); ++r) {
    const WireHeader& h = all[r];
    if (h.error_code == 0) continue;
    CommResult failed{CommResult::kPeer, Text(h.error, sizeof(h.error))};
    failed.code = static_cast<int>(h.error_code);
    if (static_cast<int>(r) != me) {
      failed.message = "local rank " + std::to_string(r) +
                       " of this node failed the " + PhaseName(h.phase) +
                       " round of layer " + std::to_string(h.layer) + " step " +
                       std::to_string(h.step) + ": " + failed.message;
    }
    return failed;
  }
  const WireHeader& first = all[0];
  for (size_t r = 1; r < all.size(); ++r) {
    const WireHeader& h = all[r];
    if (h.phase != first.phase || h.layer != first.layer ||
        h.step != first.step || h.backward_index != first.backward_index ||
        h.channels != first.channels || h.world_size != first.world_size) {
      return Invalid(
          "the local ranks of this node are not in the same round: "
          "local rank " +
          std::to_string(r) + " is at " + Where(h) + ", local rank 0 at " +
          Where(first) +
          "; every local rank must make the same calls with the "
          "same channel count and world_size");
    }
  }
  if (first.channels < 1 ||
      first.channels > std::numeric_limits<int32_t>::max() ||
      first.world_size < 1 ||
      first.world_size > std::numeric_limits<int32_t>::max()) {
    return Invalid("a round needs 1 to 2^31 - 1 channels and ranks; got " +
                   Where(first));
  }
  return CommResult{};
}

// Writes the leader's outcome into `buffer` (sized for the round): the
// header, the payload, then the mask (zeros when empty).
void EncodeOutcome(const Outcome& outcome, std::vector<char>* buffer) {
  WireOutcome w{};
  w.code = outcome.code;
  w.count = outcome.count;
  w.version = outcome.version;
  w.view_size = static_cast<int64_t>(outcome.view.size());
  CopyText(outcome.message, w.message, sizeof(w.message));
  const size_t payload_bytes = outcome.payload.size() * sizeof(double);
  std::memcpy(buffer->data(), &w, sizeof(w));
  std::memcpy(buffer->data() + sizeof(w), outcome.payload.data(),
              payload_bytes);
  if (!outcome.mask.empty()) {
    std::memcpy(buffer->data() + sizeof(w) + payload_bytes, outcome.mask.data(),
                outcome.mask.size());
  }
}

// Reads all but the view into *outcome; returns the view's announced size.
int64_t DecodeOutcome(const std::vector<char>& buffer, size_t payload_bytes,
                      Outcome* outcome) {
  WireOutcome w;
  std::memcpy(&w, buffer.data(), sizeof(w));
  outcome->code = static_cast<int>(w.code);
  outcome->message = Text(w.message, sizeof(w.message));
  outcome->count = w.count;
  outcome->version = w.version;
  outcome->payload.resize(payload_bytes / sizeof(double));
  std::memcpy(outcome->payload.data(), buffer.data() + sizeof(w),
              payload_bytes);
  outcome->mask.assign(buffer.begin() + sizeof(w) + payload_bytes,
                       buffer.end());
  return w.view_size;
}

}  // namespace

CommResult NodeRound::Gather(const RoundEntry& entry, const double* values,
                             Gathered* out) {
  WireHeader mine{};
  mine.magic = kMagic;
  mine.phase = static_cast<int64_t>(entry.phase);
  mine.layer = entry.layer;
  mine.step = entry.step;
  mine.backward_index = entry.backward_index;
  mine.count = entry.count;
  mine.channels = entry.channels;
  mine.world_size = entry.world_size;
  mine.upstream_ms = entry.upstream_ms;
  mine.error_code = entry.error_code;
  CopyText(entry.error, mine.error, sizeof(mine.error));
  const int size = comm_->size();
  std::vector<double> send(kHeaderDoubles), recv(kHeaderDoubles * size);
  std::memcpy(send.data(), &mine, sizeof(mine));
  CommResult r = comm_->AllGather(send.data(), recv.data(), kHeaderDoubles);
  if (!r.ok()) return r;
  std::vector<WireHeader> all(size);
  for (int q = 0; q < size; ++q) {
    std::memcpy(&all[q], recv.data() + q * kHeaderDoubles, sizeof(WireHeader));
  }
  r = Verdict(all, comm_->rank());
  if (!r.ok()) return r;
  channels_ = all[0].channels;
  world_size_ = all[0].world_size;
  upstream_ms_ = std::max<int64_t>(0, all[0].upstream_ms);
  const size_t per_rank = 2 * static_cast<size_t>(channels_);
  out->counts.resize(size);
  for (int q = 0; q < size; ++q) out->counts[q] = all[q].count;
  out->values.resize(per_rank * size);
  return comm_->AllGather(values, out->values.data(), per_rank);
}

CommResult NodeRound::Share(bool leader, Outcome* outcome) {
  const size_t payload_bytes =
      2 * static_cast<size_t>(channels_) * sizeof(double);
  const size_t mask_bytes = (static_cast<size_t>(world_size_) + 7) / 8;
  std::vector<char> buffer(sizeof(WireOutcome) + payload_bytes + mask_bytes);
  if (leader) {
    if (outcome->payload.size() * sizeof(double) != payload_bytes ||
        (!outcome->mask.empty() && outcome->mask.size() != mask_bytes) ||
        outcome->view.size() > static_cast<size_t>(world_size_)) {
      return Invalid("the leader's outcome does not have the round's sizes");
    }
    EncodeOutcome(*outcome, &buffer);
  }
  // The others wait while the leader does its round upstream.
  const int64_t extra_ms = leader ? 0 : upstream_ms_;
  const CommResult r =
      comm_->Broadcast(buffer.data(), buffer.size(), /*root=*/0, extra_ms);
  if (!r.ok()) return r;
  if (leader) return ShareView(&outcome->view);
  const int64_t view_size = DecodeOutcome(buffer, payload_bytes, outcome);
  // A leader of this protocol never sends more (it checked above); one
  // that did could not be followed into a broadcast of unknown size.
  if (view_size < 0 || view_size > world_size_) {
    return CommResult{
        CommResult::kFailed,
        "the node leader announced a view of " + std::to_string(view_size) +
            " entries for a job of world_size " + std::to_string(world_size_)};
  }
  outcome->view.assign(static_cast<size_t>(view_size), ViewEntry{});
  return ShareView(&outcome->view);
}

CommResult NodeRound::ShareView(std::vector<ViewEntry>* view) {
  if (view->empty()) return CommResult{};
  std::vector<int64_t> wire(kViewEntryInts * view->size());
  for (size_t i = 0; i < view->size(); ++i) {
    wire[kViewEntryInts * i] = (*view)[i].rank;
    wire[kViewEntryInts * i + 1] = (*view)[i].step;
  }
  // The leader's round upstream is over: no extra wait.
  const CommResult r =
      comm_->Broadcast(wire.data(), wire.size() * sizeof(int64_t), /*root=*/0);
  if (!r.ok()) return r;
  for (size_t i = 0; i < view->size(); ++i) {
    (*view)[i].rank = wire[kViewEntryInts * i];
    (*view)[i].step = wire[kViewEntryInts * i + 1];
  }
  return CommResult{};
}

}  // namespace nccl
}  // namespace syncnorm
