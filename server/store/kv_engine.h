// An ordered key-value engine with atomic batches: what the state store
// needs from RocksDB, so that tests can run it in memory or inject faults.
#ifndef SYNCNORM_SERVER_STORE_KV_ENGINE_H_
#define SYNCNORM_SERVER_STORE_KV_ENGINE_H_

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace syncnorm {

// Writes applied together or not at all, in order.
class KvBatch {
 public:
  struct Op {
    enum Kind { kPut, kDelete, kDeleteRange } kind;
    std::string key;    // kDeleteRange: first key
    std::string value;  // kPut: value; kDeleteRange: end key (exclusive)
    // kPut: a value that a later write will soon delete (a round kept for
    // retries), of a key the engine does not hold (never written, or
    // deleted since); an engine may keep it from its slower storage until
    // then, and when the delete comes first, leave both out of it.
    bool transient = false;
  };

  void Put(std::string key, std::string value) {
    ops_.push_back(Op{Op::kPut, std::move(key), std::move(value)});
  }
  // A Put whose value a later write will soon delete (Op::transient).
  void PutTransient(std::string key, std::string value) {
    ops_.push_back(Op{Op::kPut, std::move(key), std::move(value), true});
  }
  void Delete(std::string key) {
    ops_.push_back(Op{Op::kDelete, std::move(key), {}});
  }
  // Deletes every key in [begin, end).
  void DeleteRange(std::string begin, std::string end) {
    ops_.push_back(Op{Op::kDeleteRange, std::move(begin), std::move(end)});
  }
  // Room for `ops` operations in all, so that adding them allocates once.
  void Reserve(size_t ops) { ops_.reserve(ops); }
  const std::vector<Op>& ops() const { return ops_; }

 private:
  std::vector<Op> ops_;
};

// Thread-safe. Errors carry the engine's location in their message.
class KvEngine {
 public:
  virtual ~KvEngine() = default;

  // Where the data lives, for messages.
  virtual std::string Describe() const = 0;

  // Applies `batch` atomically; OK means it is in the write-ahead log (and
  // fsynced if the engine syncs writes).
  virtual absl::Status Write(const KvBatch& batch) = 0;

  // The value of `key`, nullopt if absent.
  virtual absl::StatusOr<std::optional<std::string>> Get(
      absl::string_view key) = 0;

  // Calls `visit` for every key starting with `prefix`, in key order, until
  // it returns a non-OK status (which Scan then returns).
  virtual absl::Status Scan(
      absl::string_view prefix,
      const std::function<absl::Status(absl::string_view key,
                                       absl::string_view value)>& visit) = 0;

  // Writes a copy of every key, as of one moment, to the new folder `dir`
  // (which must not exist), where it opens as a RocksDB database: a backup.
  // FAILED_PRECONDITION for an engine that cannot (state in memory);
  // otherwise the engine's error, with `dir` left incomplete.
  virtual absl::Status CopyTo(const std::string& dir) = 0;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_STORE_KV_ENGINE_H_
