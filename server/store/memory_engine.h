// A KvEngine in memory: nothing survives the process. For tests, and for
// an aggregator started without a data_dir.
#ifndef SYNCNORM_SERVER_STORE_MEMORY_ENGINE_H_
#define SYNCNORM_SERVER_STORE_MEMORY_ENGINE_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/store/kv_engine.h"

namespace syncnorm {

// Thread-safe.
class MemoryEngine final : public KvEngine {
 public:
  std::string Describe() const override { return "memory (not durable)"; }
  absl::Status Write(const KvBatch& batch) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::optional<std::string>> Get(absl::string_view key) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Scan(
      absl::string_view prefix,
      const std::function<absl::Status(absl::string_view, absl::string_view)>&
          visit) override ABSL_LOCKS_EXCLUDED(mu_);
  // FAILED_PRECONDITION: nothing in memory is worth a backup.
  absl::Status CopyTo(const std::string& dir) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string, std::less<>> data_ ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_STORE_MEMORY_ENGINE_H_
