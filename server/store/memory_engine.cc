#include "server/store/memory_engine.h"

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace syncnorm {

absl::Status MemoryEngine::Write(const KvBatch& batch) {
  absl::MutexLock lock(&mu_);
  for (const KvBatch::Op& op : batch.ops()) {
    switch (op.kind) {
      case KvBatch::Op::kPut:
        data_[op.key] = op.value;
        break;
      case KvBatch::Op::kDelete:
        data_.erase(op.key);
        break;
      case KvBatch::Op::kDeleteRange:
        data_.erase(data_.lower_bound(op.key), data_.lower_bound(op.value));
        break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> MemoryEngine::Get(
    absl::string_view key) {
  absl::MutexLock lock(&mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return std::optional<std::string>();
  return std::optional<std::string>(it->second);
}

absl::Status MemoryEngine::Scan(
    absl::string_view prefix,
    const std::function<absl::Status(absl::string_view, absl::string_view)>&
        visit) {
  // Copied out so that `visit` runs without the lock.
  std::vector<std::pair<std::string, std::string>> rows;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = data_.lower_bound(prefix);
         it != data_.end() && absl::StartsWith(it->first, prefix); ++it) {
      rows.emplace_back(it->first, it->second);
    }
  }
  for (const auto& [key, value] : rows) {
    absl::Status s = visit(key, value);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status MemoryEngine::CopyTo(const std::string& dir) {
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot back up to '", dir,
      "': this aggregator keeps its state in memory (no --data_dir), and it "
      "ends with the process"));
}

}  // namespace syncnorm
