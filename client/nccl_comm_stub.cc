// nccl_comm.h in a build without CUDA/NCCL: every call is kUnavailable.
#include <memory>
#include <string>

#include "client/nccl_comm.h"

namespace syncnorm {
namespace nccl {
namespace {

CommResult NoNccl() {
  return CommResult{CommResult::kUnavailable,
                    "syncnorm was built without CUDA/NCCL (no toolkit at "
                    "/usr/local/cuda at build time); use ThreadNode or "
                    "SoloNodeGroup"};
}

}  // namespace

struct Comm::State {};

CommResult NewUniqueId(std::string*) { return NoNccl(); }

Comm::Comm(std::unique_ptr<State> state) : state_(std::move(state)) {}
Comm::~Comm() = default;
int Comm::size() const { return 0; }
int Comm::rank() const { return 0; }
int Comm::device() const { return -1; }
bool Comm::aborted() const { return true; }

CommResult Comm::Create(const std::string&, int, int, int, int64_t,
                        std::unique_ptr<Comm>*) {
  return NoNccl();
}
CommResult Comm::AllGather(const double*, double*, size_t) { return NoNccl(); }
CommResult Comm::AllReduceSum(const double*, double*, size_t) {
  return NoNccl();
}
CommResult Comm::Broadcast(void*, size_t, int, int64_t) { return NoNccl(); }

}  // namespace nccl
}  // namespace syncnorm
