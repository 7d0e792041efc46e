#include "server/store/rocksdb_engine.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rocksdb/db.h"
#include "rocksdb/iterator.h"
#include "rocksdb/metadata.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"
#include "server/store/file_copy.h"

namespace syncnorm {
namespace {

// A rocksdb::WriteBatch's bytes: a 12-byte header (sequence number,
// count), then per op a type byte and the varint32 lengths of its key and
// value (at most 5 bytes each), then the bytes themselves.
constexpr size_t kWriteBatchHeader = 12;
constexpr size_t kWriteBatchOpOverhead = 11;

// RocksDB's status in Abseil's terms, `what` and the folder in front.
absl::Status FromRocks(const rocksdb::Status& s, const std::string& dir,
                       absl::string_view what) {
  const std::string message =
      absl::StrCat(what, " in data_dir '", dir, "': ", s.ToString());
  if (s.IsNoSpace()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(message, "; the disk is full: free space, then retry"));
  }
  if (s.IsCorruption()) {
    return absl::DataLossError(absl::StrCat(
        message,
        "; the state is corrupt: restore the folder from a backup, "
        "or move it away to start empty"));
  }
  if (s.IsIOError()) return absl::UnavailableError(message);
  return absl::InternalError(message);
}

// Creates `dir` and its parents; a clear error if it cannot be.
absl::Status MakeDirs(const std::string& dir) {
  std::string path;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i < dir.size() && dir[i] != '/') continue;
    path = dir.substr(0, i);
    if (path.empty()) continue;
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create data_dir '", dir, "' (at '", path,
                       "'): ", std::strerror(errno),
                       "; choose a folder this process can create and write"));
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("data_dir '", dir, "' is not a folder; choose a folder"));
  }
  return absl::OkStatus();
}

// The highest sequence number this folder is known to have reached, kept
// beside the database: RocksDB reads a manifest or log cut short as if it
// ended there, so a folder that lost its tail would otherwise open as an
// older state without a word.
constexpr char kGuardFile[] = "/SYNCNORM_SEQUENCE";

absl::Status WriteGuard(const std::string& dir, uint64_t sequence) {
  const std::string path = dir + kGuardFile;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << sequence << "\n";
    out.close();
    if (!out) {
      return absl::UnavailableError(
          absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", tmp, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status CheckGuard(const std::string& dir, uint64_t sequence) {
  std::ifstream in(dir + kGuardFile);
  uint64_t seen = 0;
  if (!(in >> seen) || seen <= sequence) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "the state in data_dir '", dir,
      "' went back in time: it had reached "
      "update ",
      seen, " but now ends at update ", sequence,
      "; its MANIFEST or write-ahead log was truncated or replaced. Restore "
      "the folder from a backup, or move it away to start empty"));
}

// Copies one file of a live copy into `dir`: CURRENT as RocksDB saw it,
// every other file up to the size it had then (a log may have grown
// since); a table or a MANIFEST of another size than listed is refused.
absl::Status CopyLiveFile(const rocksdb::LiveFileStorageInfo& file,
                          const std::string& dir) {
  const std::string to = absl::StrCat(dir, "/", file.relative_filename);
  if (!file.replacement_contents.empty()) {
    return WriteNewFile(to, file.replacement_contents);
  }
  const std::string from =
      absl::StrCat(file.directory, "/", file.relative_filename);
  struct stat st;
  if (!file.trim_to_size && (::stat(from.c_str(), &st) != 0 ||
                             static_cast<uint64_t>(st.st_size) != file.size)) {
    return absl::DataLossError(absl::StrCat("'", from, "' is not the ",
                                            file.size, " bytes RocksDB lists"));
  }
  absl::StatusOr<FileSum> sum = CopyFilePrefix(from, to, file.size);
  return sum.status();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RocksDbEngine>> RocksDbEngine::Open(
    const std::string& dir, bool sync_writes) {
  if (dir.empty()) {
    return absl::InvalidArgumentError("data_dir is empty");
  }
  if (absl::Status s = MakeDirs(dir); !s.ok()) return s;
  // RocksDB's recovery writes (a new log, a flush); on a full disk it can
  // fail half way and then trip over its own assertions.
  struct statvfs fs;
  if (::statvfs(dir.c_str(), &fs) == 0 &&
      static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize < kFreeSpaceReserve) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the disk of data_dir '", dir,
        "' is full: ", (static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize) >> 20,
        " MiB free, and the state store needs ", kFreeSpaceReserve >> 20,
        " MiB to start; free space and start again (the state is intact)"));
  }
  rocksdb::Options options;
  options.create_if_missing = true;
  options.paranoid_checks = true;
  // A record cut short at the end of the log is a write that was never
  // acknowledged (a crash during it); anything else that does not check
  // out is corruption and stops the start instead of being skipped.
  options.wal_recovery_mode =
      rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  options.max_background_jobs = 2;
  options.keep_log_file_num = 3;
  options.max_log_file_size = 1 << 20;
  options.write_buffer_size = kWriteBufferSize;
  // Values are mostly doubles of statistics, which do not compress; snappy
  // only cost CPU in every flush and compaction.
  options.compression = rocksdb::kNoCompression;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, &raw);
  if (!s.ok()) {
    if (s.IsIOError() && absl::StrContains(s.ToString(), "lock")) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot lock data_dir '", dir, "': ", s.ToString(),
                       "; is another syncnorm-aggregator using it?"));
    }
    if (s.IsIOError() && !s.IsNoSpace()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot open the state store in data_dir '", dir, "': ", s.ToString(),
          "; check that the folder is writable"));
    }
    return FromRocks(s, dir, "cannot open the state store");
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  const uint64_t sequence = db->GetLatestSequenceNumber();
  if (absl::Status g = CheckGuard(dir, sequence); !g.ok()) return g;
  if (absl::Status g = WriteGuard(dir, sequence); !g.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data_dir '", dir, "': ", g.message(), "; check that it is writable"));
  }
  return std::unique_ptr<RocksDbEngine>(
      new RocksDbEngine(dir, sync_writes, /*read_only=*/false, std::move(db)));
}

absl::StatusOr<std::unique_ptr<RocksDbEngine>> RocksDbEngine::OpenReadOnly(
    const std::string& dir) {
  struct stat st;
  if (::stat((dir + "/CURRENT").c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat("'", dir, "' holds no state store (no CURRENT file)"));
  }
  rocksdb::Options options;
  options.paranoid_checks = true;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::OpenForReadOnly(options, dir, &raw);
  if (!s.ok()) return FromRocks(s, dir, "cannot open the state store");
  std::unique_ptr<rocksdb::DB> db(raw);
  if (absl::Status g = CheckGuard(dir, db->GetLatestSequenceNumber());
      !g.ok()) {
    return g;
  }
  return std::unique_ptr<RocksDbEngine>(new RocksDbEngine(
      dir, /*sync_writes=*/false, /*read_only=*/true, std::move(db)));
}

RocksDbEngine::RocksDbEngine(std::string dir, bool sync_writes, bool read_only,
                             std::unique_ptr<rocksdb::DB> db)
    : dir_(std::move(dir)),
      sync_writes_(sync_writes),
      read_only_(read_only),
      db_(std::move(db)) {}

RocksDbEngine::~RocksDbEngine() {
  if (read_only_) {
    db_->Close().PermitUncheckedError();
    return;
  }
  // Best effort: what is not flushed is replayed from the log next time.
  db_->Flush(rocksdb::FlushOptions()).PermitUncheckedError();
  WriteGuard(dir_, db_->GetLatestSequenceNumber()).IgnoreError();
  db_->Close().PermitUncheckedError();
}

std::string RocksDbEngine::Describe() const {
  return absl::StrCat("data_dir '", dir_, "'");
}

absl::Status RocksDbEngine::CheckFreeSpace(size_t bytes) const {
  struct statvfs fs;
  if (::statvfs(dir_.c_str(), &fs) != 0) return absl::OkStatus();
  const uint64_t free = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (free >= kFreeSpaceReserve + bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the disk of data_dir '", dir_, "' is full: ", free >> 20,
      " MiB free, and the state store keeps ", kFreeSpaceReserve >> 20,
      " MiB free for its log and tables; nothing was written. Free space "
      "and retry"));
}

absl::Status RocksDbEngine::Write(const KvBatch& batch) {
  if (read_only_) {
    return absl::FailedPreconditionError(
        absl::StrCat("data_dir '", dir_, "' is open for reading only"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
  }
  size_t bytes = 0;
  for (const KvBatch::Op& op : batch.ops()) {
    bytes += op.key.size() + op.value.size();
  }
  if (absl::Status s = CheckFreeSpace(bytes); !s.ok()) return s;
  // Sized once: a flush of the round log hands over megabytes, and a batch
  // grown by doubling copied them twice more and faulted in each new page
  // (bench/RESULTS.md).
  rocksdb::WriteBatch wb(kWriteBatchHeader + bytes +
                         kWriteBatchOpOverhead * batch.ops().size());
  for (const KvBatch::Op& op : batch.ops()) {
    rocksdb::Status s;
    switch (op.kind) {
      case KvBatch::Op::kPut:
        s = wb.Put(op.key, op.value);
        break;
      case KvBatch::Op::kDelete:
        s = wb.Delete(op.key);
        break;
      case KvBatch::Op::kDeleteRange:
        s = wb.DeleteRange(op.key, op.value);
        break;
    }
    if (!s.ok()) return FromRocks(s, dir_, "cannot prepare a write");
  }
  rocksdb::WriteOptions options;
  options.sync = sync_writes_;
  rocksdb::Status s = db_->Write(options, &wb);
  if (!s.ok()) {
    // RocksDB does not take writes again on a log that failed one (it may
    // even assert); the store stops writing until the server restarts,
    // which recovers every acknowledged write from the log.
    absl::Status failed = FromRocks(s, dir_, "cannot write the state");
    absl::MutexLock lock(&mu_);
    broken_ = absl::Status(
        failed.code(),
        absl::StrCat(failed.message(),
                     "; the state store takes no more writes until the "
                     "aggregator restarts (nothing acknowledged is lost)"));
    return broken_;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> RocksDbEngine::Get(
    absl::string_view key) {
  std::string value;
  rocksdb::ReadOptions options;
  options.verify_checksums = true;
  rocksdb::Status s =
      db_->Get(options, rocksdb::Slice(key.data(), key.size()), &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  if (!s.ok()) return FromRocks(s, dir_, absl::StrCat("cannot read ", key));
  return std::optional<std::string>(std::move(value));
}

absl::Status RocksDbEngine::Scan(
    absl::string_view prefix,
    const std::function<absl::Status(absl::string_view, absl::string_view)>&
        visit) {
  rocksdb::ReadOptions options;
  options.verify_checksums = true;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(options));
  const rocksdb::Slice start(prefix.data(), prefix.size());
  for (it->Seek(start); it->Valid() && it->key().starts_with(start);
       it->Next()) {
    absl::Status s =
        visit(absl::string_view(it->key().data(), it->key().size()),
              absl::string_view(it->value().data(), it->value().size()));
    if (!s.ok()) return s;
  }
  if (!it->status().ok()) {
    return FromRocks(
        it->status(), dir_,
        absl::StrCat("cannot read the records under '", prefix, "'"));
  }
  return absl::OkStatus();
}

absl::Status RocksDbEngine::CopyTo(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create '", dir, "': ", std::strerror(errno)));
  }
  // Until EnableFileDeletions, no file on the list goes away under the copy
  // (a compaction's inputs stay until then).
  rocksdb::Status s = db_->DisableFileDeletions();
  if (!s.ok()) return FromRocks(s, dir_, "cannot start a copy");
  std::vector<rocksdb::LiveFileStorageInfo> files;
  // The default flushes the memtable first: every acknowledged write is in
  // the files listed.
  s = db_->GetLiveFilesStorageInfo(rocksdb::LiveFilesStorageInfoOptions(),
                                   &files);
  absl::Status copied =
      s.ok() ? absl::OkStatus() : FromRocks(s, dir_, "cannot list its files");
  for (size_t i = 0; copied.ok() && i < files.size(); ++i) {
    copied = CopyLiveFile(files[i], dir);
  }
  db_->EnableFileDeletions(/*force=*/false).PermitUncheckedError();
  if (copied.ok()) copied = SyncPath(dir);
  if (copied.ok()) return copied;
  return absl::Status(copied.code(),
                      absl::StrCat("cannot copy the state of data_dir '", dir_,
                                   "' to '", dir, "': ", copied.message()));
}

absl::Status RocksDbEngine::VerifyChecksums() {
  rocksdb::Status s = db_->VerifyChecksum();
  if (!s.ok()) return FromRocks(s, dir_, "a table file does not check out");
  return absl::OkStatus();
}

absl::Status RocksDbEngine::Compact() {
  rocksdb::CompactRangeOptions options;
  options.bottommost_level_compaction =
      rocksdb::BottommostLevelCompaction::kForce;
  rocksdb::Status s = db_->CompactRange(options, nullptr, nullptr);
  if (!s.ok()) return FromRocks(s, dir_, "cannot compact the state");
  return absl::OkStatus();
}

}  // namespace syncnorm
