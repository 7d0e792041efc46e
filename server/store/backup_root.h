// Backups of the state store, in folders under one root (--backup_dir).
#ifndef SYNCNORM_SERVER_STORE_BACKUP_ROOT_H_
#define SYNCNORM_SERVER_STORE_BACKUP_ROOT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/domain/aggregator.h"
#include "server/domain/clock.h"
#include "server/domain/job.h"
#include "server/store/state_store.h"

namespace syncnorm {

// What a backup holds, from its manifest.
struct BackupSummary {
  std::string name;
  // The shard ordinal it was taken as.
  int shard = 0;
  absl::Time created;
  // The syncnorm version of the server that wrote it.
  std::string version;
  // The job it was limited to; empty: every job.
  std::string job_id;
  // Its jobs, each with its committed step in the backup.
  std::vector<JobSnapshot> jobs;
  // Its folder, and the size of its files.
  std::string path;
  int64_t bytes = 0;
};

// The backups under `root`: <root>/<name>/shard-<shard>/ holds a copy of
// the state store's data dir (every file copied, none linked; it opens as
// a --data_dir) and SYNCNORM_BACKUP, the manifest, written last, which
// lists every file with its size and CRC32C; a backup is written under a
// hidden name and renamed into place once whole, so a folder of that name
// is always complete. The root may be shared by several shards (their
// folders differ). Thread-safe; backups are written one at a time.
class BackupRoot {
 public:
  // Creates `root` (and its parents) if missing. FAILED_PRECONDITION naming
  // it when it cannot be created or written. `store` and `clock` must
  // outlive the object.
  static absl::StatusOr<std::unique_ptr<BackupRoot>> Open(std::string root,
                                                          StateStore* store,
                                                          const Clock* clock);

  // Writes the backup `name` (empty: the UTC time, e.g. 20240601-120000)
  // of every job of the store, or of `job_id` only, as shard `shard`.
  // INVALID_ARGUMENT for a bad name or shard; ALREADY_EXISTS when it
  // exists; NOT_FOUND when the store has no job `job_id`;
  // FAILED_PRECONDITION when the store is in memory; the copy's error
  // otherwise. A refused or failed backup leaves nothing in the root. A job
  // spread over shards whose part here is another shard's is backed up all the
  // same (and logged): Read leaves it out.
  absl::StatusOr<BackupSummary> Create(std::string name, int shard,
                                       const std::string& job_id)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The backups of shard `shard`, oldest first. A folder whose manifest
  // does not read is left out (and logged).
  std::vector<BackupSummary> List(int shard) const;

  // Every job of backup `name` of shard `shard` (or `job_id` only), each
  // checked as the store checks its records at start, with the backup's
  // summary in *summary (when not null). A job spread over shards whose
  // part in the backup is another shard's is left out, and why goes to
  // *left_out (when not null); FAILED_PRECONDITION when it is `job_id`.
  // NOT_FOUND when there is no folder of that backup, or no such job in
  // it; DATA_LOSS naming the backup's folder and what is wrong when it is
  // damaged in any way: its manifest or a file it lists missing, cut short
  // or changed (each checked against the manifest's size and CRC32C before
  // any is read), or a record that does not check out.
  absl::StatusOr<std::vector<JobImage>> Read(
      const std::string& name, int shard, const std::string& job_id,
      BackupSummary* summary,
      std::vector<JobRestore>* left_out = nullptr) const;

  const std::string& root() const { return root_; }

 private:
  BackupRoot(std::string root, StateStore* store, const Clock* clock)
      : root_(std::move(root)), store_(store), clock_(clock) {}

  std::string FolderOf(const std::string& name, int shard) const;
  // Copies the store into `staging`, prunes it to `job_id` (unless empty),
  // and writes the manifest there.
  absl::StatusOr<BackupSummary> Write(const std::string& staging,
                                      const std::string& name, int shard,
                                      const std::string& job_id);

  // Constant after construction.
  const std::string root_;
  StateStore* const store_;
  const Clock* const clock_;

  // Held while a backup is written.
  absl::Mutex mu_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_STORE_BACKUP_ROOT_H_
