// A KvEngine wrapper that fails writes on demand (tests only).
#ifndef SYNCNORM_SERVER_STORE_FAULTY_ENGINE_H_
#define SYNCNORM_SERVER_STORE_FAULTY_ENGINE_H_

#include <atomic>
#include <string>

#include "server/store/kv_engine.h"

namespace syncnorm {

// Forwards to `base` (which must outlive it) until fail_writes(true); then
// every Write fails with the given status and changes nothing. Thread-safe.
class FaultyEngine final : public KvEngine {
 public:
  explicit FaultyEngine(KvEngine* base) : base_(base) {}

  void fail_writes(bool fail) { fail_.store(fail); }
  int writes() const { return writes_.load(); }
  // The operations of the largest batch written so far.
  size_t largest_batch() const { return largest_batch_.load(); }

  std::string Describe() const override { return base_->Describe(); }
  absl::Status Write(const KvBatch& batch) override {
    if (fail_.load()) {
      return absl::ResourceExhaustedError(
          "injected write failure: no space left on device");
    }
    ++writes_;
    size_t largest = largest_batch_.load();
    while (batch.ops().size() > largest &&
           !largest_batch_.compare_exchange_weak(largest, batch.ops().size())) {
    }
    return base_->Write(batch);
  }
  absl::StatusOr<std::optional<std::string>> Get(
      absl::string_view key) override {
    return base_->Get(key);
  }
  absl::Status Scan(
      absl::string_view prefix,
      const std::function<absl::Status(absl::string_view, absl::string_view)>&
          visit) override {
    return base_->Scan(prefix, visit);
  }
  absl::Status CopyTo(const std::string& dir) override {
    return base_->CopyTo(dir);
  }

 private:
  KvEngine* const base_;
  std::atomic<bool> fail_{false};
  std::atomic<int> writes_{0};
  std::atomic<size_t> largest_batch_{0};
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_STORE_FAULTY_ENGINE_H_
