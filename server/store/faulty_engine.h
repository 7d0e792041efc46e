// A KvEngine wrapper that fails writes on demand (tests only).
#ifndef SYNCNORM_SERVER_STORE_FAULTY_ENGINE_H_
#define SYNCNORM_SERVER_STORE_FAULTY_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
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
  // The puts of keys starting with `prefix` written so far, in all
  // batches. REQUIRES: no write runs concurrently.
  int64_t puts(absl::string_view prefix) const {
    absl::MutexLock lock(&mu_);
    return Under(puts_, prefix);
  }
  // The same for deletes.
  int64_t deletes(absl::string_view prefix) const {
    absl::MutexLock lock(&mu_);
    return Under(deletes_, prefix);
  }

  std::string Describe() const override { return base_->Describe(); }
  absl::Status Write(const KvBatch& batch) override {
    if (fail_.load()) {
      return absl::ResourceExhaustedError(
          "injected write failure: no space left on device");
    }
    ++writes_;
    {
      absl::MutexLock lock(&mu_);
      for (const KvBatch::Op& op : batch.ops()) {
        if (op.kind == KvBatch::Op::kPut) ++puts_[op.key];
        if (op.kind == KvBatch::Op::kDelete) ++deletes_[op.key];
      }
    }
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
  // The counts of `ops`' keys that start with `prefix`, summed.
  static int64_t Under(const absl::flat_hash_map<std::string, int64_t>& ops,
                       absl::string_view prefix) {
    int64_t n = 0;
    for (const auto& [key, count] : ops) {
      if (absl::StartsWith(key, prefix)) n += count;
    }
    return n;
  }

  KvEngine* const base_;
  std::atomic<bool> fail_{false};
  std::atomic<int> writes_{0};
  std::atomic<size_t> largest_batch_{0};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int64_t> puts_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> deletes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_STORE_FAULTY_ENGINE_H_
