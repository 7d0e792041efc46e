// The KvEngine of a real data_dir: an embedded RocksDB with its
// write-ahead log.
#ifndef SYNCNORM_SERVER_STORE_ROCKSDB_ENGINE_H_
#define SYNCNORM_SERVER_STORE_ROCKSDB_ENGINE_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/store/kv_engine.h"

namespace rocksdb {
class DB;
}  // namespace rocksdb

namespace syncnorm {

// Thread-safe. Every Write goes to the WAL before it returns (a killed
// process loses nothing written); with sync_writes the WAL is also fsynced
// (a machine crash loses nothing written).
//
// A full disk: writes are refused (RESOURCE_EXHAUSTED, nothing written)
// while less than kFreeSpaceReserve is free, so that RocksDB itself, whose
// flushes need room, never runs out. Should a write fail inside RocksDB
// anyway, the engine refuses every later write with that error until the
// process restarts (reads go on).
class RocksDbEngine final : public KvEngine {
 public:
  // The memtable size; a flush writes about this much.
  static constexpr size_t kWriteBufferSize = 8 << 20;
  // Free space below which writes are refused: room for two memtable
  // flushes and the log.
  static constexpr uint64_t kFreeSpaceReserve =
      2 * kWriteBufferSize + (1 << 20);

  // Opens (creating if needed, parents included) the database in `dir`.
  // FAILED_PRECONDITION when the folder cannot be created, written or
  // locked (another server uses it), DATA_LOSS when what is there is
  // corrupt, RESOURCE_EXHAUSTED when the disk is full; each message names
  // `dir` and what to do.
  static absl::StatusOr<std::unique_ptr<RocksDbEngine>> Open(
      const std::string& dir, bool sync_writes);

  // Opens the database in `dir` (a backup) for reading only: no lock, and
  // nothing in the folder changes; every Write is FAILED_PRECONDITION.
  // NOT_FOUND when `dir` holds no database, DATA_LOSS when it is corrupt.
  static absl::StatusOr<std::unique_ptr<RocksDbEngine>> OpenReadOnly(
      const std::string& dir);

  // Flushes the memtable (a faster next start) and closes.
  ~RocksDbEngine() override;

  std::string Describe() const override;
  absl::Status Write(const KvBatch& batch) override;
  absl::StatusOr<std::optional<std::string>> Get(
      absl::string_view key) override;
  absl::Status Scan(
      absl::string_view prefix,
      const std::function<absl::Status(absl::string_view, absl::string_view)>&
          visit) override;
  // A copy of every live file (never a hard link: a backup shares no
  // block with the data dir), each file streamed, fsynced and checked for
  // the size RocksDB lists; the memtable flushed first, so that the copy
  // holds every write acknowledged before the call.
  absl::Status CopyTo(const std::string& dir) override;

  // Reads every block of every table file against its checksum (a copy
  // just made). DATA_LOSS naming the file when one does not check out.
  absl::Status VerifyChecksums();

  // Rewrites every table, so that the data of deleted keys is gone from
  // the files (a backup pruned to one job). The engine's error otherwise.
  absl::Status Compact();

 private:
  RocksDbEngine(std::string dir, bool sync_writes, bool read_only,
                std::unique_ptr<rocksdb::DB> db);

  // Constant after construction.
  const std::string dir_;
  const bool sync_writes_;
  const bool read_only_;
  const std::unique_ptr<rocksdb::DB> db_;

  absl::Status CheckFreeSpace(size_t bytes) const;

  absl::Mutex mu_;
  // Not OK once a RocksDB write failed: every later write gets it.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_STORE_ROCKSDB_ENGINE_H_
