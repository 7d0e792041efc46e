#include "server/store/backup_root.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/domain/bounded_text.h"
#include "server/domain/log.h"
#include "server/store/crc32c.h"
#include "server/store/file_copy.h"
#include "server/store/kv_state_store.h"
#include "server/store/rocksdb_engine.h"
#include "server/store/state.pb.h"
#include "server/store/state_codec.h"
#include "syncnorm_version.h"

namespace syncnorm {
namespace {

namespace fs = std::filesystem;

constexpr char kManifest[] = "SYNCNORM_BACKUP";
constexpr size_t kMaxNameLength = 128;

absl::Status CheckName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= kMaxNameLength && name[0] != '.';
  for (char c : name) {
    ok = ok && (absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-');
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "backup name '", BoundedText(name), "' is not valid: use 1 to ",
      kMaxNameLength, " characters of [A-Za-z0-9._-], not starting with '.'"));
}

absl::Status CheckShard(int shard) {
  if (shard >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("shard is ", shard, "; shard ordinals start at 0"));
}

// The tag of BackupManifest.crc32c (field 9, fixed32), the first of the
// manifest's last 5 bytes.
constexpr char kCrcTag = (9 << 3) | 5;
constexpr size_t kCrcBytes = 5;

// `bytes` with BackupManifest.crc32c, their CRC32C, appended.
std::string Sealed(std::string bytes) {
  const uint32_t crc = Crc32c(0, bytes.data(), bytes.size());
  bytes.push_back(kCrcTag);
  for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>(crc >> 8 * i));
  return bytes;
}

// Whether `bytes` end with the CRC32C of what comes before it.
bool SealHolds(const std::string& bytes) {
  if (bytes.size() < kCrcBytes || bytes[bytes.size() - kCrcBytes] != kCrcTag) {
    return false;
  }
  const size_t body = bytes.size() - kCrcBytes;
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) {
    stored |=
        static_cast<uint32_t>(static_cast<unsigned char>(bytes[body + 1 + i]))
        << 8 * i;
  }
  return stored == Crc32c(0, bytes.data(), body);
}

// Files of a backup's folder that are not its data: RocksDB's info logs,
// which a read-only open rewrites, its LOCK, and the manifest.
bool IsListed(const std::string& name) {
  return !absl::StartsWith(name, "LOG") && name != "LOCK" &&
         !absl::StartsWith(name, kManifest);
}

// Every listed file of `folder`, in name order, with its size and CRC32C.
absl::Status ListFiles(const std::string& folder,
                       storage::BackupManifest& manifest) {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    const std::string name = entry.path().filename().string();
    if (IsListed(name)) names.push_back(name);
  }
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot list '", folder, "': ", error.message()));
  }
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    absl::StatusOr<FileSum> sum = SumFile(absl::StrCat(folder, "/", name));
    if (!sum.ok()) return sum.status();
    storage::BackupFile* file = manifest.add_files();
    file->set_name(name);
    file->set_size(sum->size);
    file->set_crc32c(sum->crc32c);
  }
  return absl::OkStatus();
}

absl::Status WriteManifest(const std::string& folder,
                           const storage::BackupManifest& manifest) {
  const std::string path = absl::StrCat(folder, "/", kManifest);
  const std::string tmp = path + ".tmp";
  if (absl::Status s = WriteNewFile(tmp, Sealed(manifest.SerializeAsString()));
      !s.ok()) {
    return s;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot rename '", tmp, "': ", std::strerror(errno)));
  }
  return SyncPath(folder);
}

int64_t FolderBytes(const std::string& folder) {
  int64_t bytes = 0;
  std::error_code error;
  for (const auto& entry : fs::recursive_directory_iterator(folder, error)) {
    if (entry.is_regular_file(error)) {
      bytes += static_cast<int64_t>(entry.file_size(error));
    }
  }
  return bytes;
}

// DATA_LOSS: the backup in `folder` is damaged, and how.
absl::Status Damaged(const std::string& folder, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("the backup in '", folder,
                                          "' is damaged: ", what,
                                          "; restore from another backup"));
}

// The manifest of the backup in `folder` as a summary, its record in
// *proto when not null; DATA_LOSS when it is missing or does not read.
absl::StatusOr<BackupSummary> ReadManifest(
    const std::string& folder, storage::BackupManifest* proto = nullptr) {
  const std::string path = absl::StrCat(folder, "/", kManifest);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Damaged(folder, absl::StrCat("its manifest ", kManifest,
                                        " is missing or unreadable"));
  }
  const std::string bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  storage::BackupManifest m;
  if (!m.ParseFromString(bytes)) {
    return Damaged(folder,
                   absl::StrCat("its manifest ", kManifest, " does not parse"));
  }
  // A manifest that lists files carries its checksum (older ones neither).
  if ((m.files_size() > 0 || m.crc32c() != 0) && !SealHolds(bytes)) {
    return Damaged(folder, absl::StrCat("its manifest ", kManifest,
                                        " does not match its checksum"));
  }
  if (m.format() == 0 || m.format() > kStateFormat) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' has format ", m.format(),
                     "; this build reads formats 1..", kStateFormat,
                     " (was it written by a newer syncnorm?)"));
  }
  BackupSummary s;
  s.name = m.name();
  s.shard = m.shard();
  s.created = absl::FromUnixMillis(m.created_unix_ms());
  s.version = m.version();
  s.job_id = m.job_id();
  for (const storage::BackupManifestJob& j : m.jobs()) {
    absl::StatusOr<JobSpec> spec = DecodeJob(j.job_record());
    if (!spec.ok()) {
      return absl::DataLossError(absl::StrCat(
          "'", path,
          "' holds a job that does not read: ", spec.status().message()));
    }
    JobSnapshot job;
    job.spec = *std::move(spec);
    job.committed_step = j.committed_step();
    s.jobs.push_back(std::move(job));
  }
  s.path = folder;
  s.bytes = FolderBytes(folder);
  if (proto != nullptr) *proto = std::move(m);
  return s;
}

// Every file that the manifest of the backup in `folder` lists, as
// written: DATA_LOSS naming the first that is missing, of another size, or
// of other bytes.
absl::Status CheckFiles(const std::string& folder,
                        const storage::BackupManifest& manifest) {
  for (const storage::BackupFile& file : manifest.files()) {
    absl::StatusOr<FileSum> sum =
        SumFile(absl::StrCat(folder, "/", file.name()));
    if (absl::IsNotFound(sum.status())) {
      return Damaged(folder,
                     absl::StrCat("its file ", file.name(), " is missing"));
    }
    if (!sum.ok()) {
      return Damaged(folder,
                     absl::StrCat("its file ", file.name(),
                                  " does not read: ", sum.status().message()));
    }
    if (sum->size != file.size()) {
      return Damaged(
          folder, absl::StrCat("its file ", file.name(), " has ", sum->size,
                               " bytes, and the backup wrote ", file.size()));
    }
    if (sum->crc32c != file.crc32c()) {
      return Damaged(folder, absl::StrCat("its file ", file.name(),
                                          " does not match its checksum"));
    }
  }
  return absl::OkStatus();
}

// FAILED_PRECONDITION when `spec` is a job spread over shards whose part
// here is not shard `shard`'s.
absl::Status CheckShardOf(const JobSpec& spec, int shard) {
  if (!spec.shard.sharded() || spec.shard.shard == shard) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "job '", BoundedText(spec.job_id), "' is spread over ",
      spec.shard.num_shards, " shards and this server holds shard ",
      spec.shard.shard, "'s part, not shard ", shard,
      "'s; give the client every shard, in ordinal order"));
}

// The job's committed step by the rule the aggregator serves it with.
int64_t CommittedStepOf(const StoredJob& stored, StateStore* store) {
  RealClock clock;
  Job job(stored.spec, JobOptions{}, store, &clock);
  job.Load(stored);
  return job.ReportedCommittedStep();
}

// Every job image of the backup in `folder`. The folder exists and its
// manifest read, so whatever fails to open or read in it is damage
// (a backup written before files were listed has no other check): DATA_LOSS.
absl::StatusOr<std::vector<JobImage>> LoadBackup(const std::string& folder) {
  absl::StatusOr<std::unique_ptr<RocksDbEngine>> engine =
      RocksDbEngine::OpenReadOnly(folder);
  if (!engine.ok()) return Damaged(folder, engine.status().message());
  KvStateStore backup(*std::move(engine));
  absl::StatusOr<std::vector<JobImage>> images = backup.LoadImages();
  if (!images.ok()) return Damaged(folder, images.status().message());
  return images;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BackupRoot>> BackupRoot::Open(
    std::string root, StateStore* store, const Clock* clock) {
  std::error_code error;
  fs::create_directories(root, error);
  if (error || !fs::is_directory(root)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create backup_dir '", root,
                     "': ", error ? error.message() : "not a folder",
                     "; choose a folder this process can create and write"));
  }
  if (::access(root.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("backup_dir '", root, "' is not writable by this user"));
  }
  return std::unique_ptr<BackupRoot>(
      new BackupRoot(std::move(root), store, clock));
}

std::string BackupRoot::FolderOf(const std::string& name, int shard) const {
  return absl::StrCat(root_, "/", name, "/shard-", shard);
}

absl::StatusOr<BackupSummary> BackupRoot::Create(std::string name, int shard,
                                                 const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  if (name.empty()) {
    name =
        absl::FormatTime("%Y%m%d-%H%M%S", clock_->Now(), absl::UTCTimeZone());
  }
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  if (absl::Status s = CheckShard(shard); !s.ok()) return s;
  const std::string folder = FolderOf(name, shard);
  if (fs::exists(folder)) {
    return absl::AlreadyExistsError(
        absl::StrCat("backup '", name, "' of shard ", shard, " exists ('",
                     folder, "'); choose another name"));
  }
  const std::string parent = absl::StrCat(root_, "/", name);
  const std::string staging =
      absl::StrCat(parent, "/.shard-", shard, ".partial");
  std::error_code error;
  fs::remove_all(staging, error);  // what a crash during a backup left
  fs::create_directories(parent, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create '", parent, "': ", error.message()));
  }
  absl::StatusOr<BackupSummary> summary = Write(staging, name, shard, job_id);
  if (summary.ok() && std::rename(staging.c_str(), folder.c_str()) != 0) {
    summary = absl::UnavailableError(absl::StrCat("cannot rename '", staging,
                                                  "' to '", folder,
                                                  "': ", std::strerror(errno)));
  }
  if (summary.ok()) {
    if (absl::Status s = SyncPath(parent); !s.ok()) summary = s;
  }
  if (!summary.ok()) {
    fs::remove_all(staging, error);
    fs::remove_all(folder, error);
    // The name's folder too, unless another shard's backup is in it
    // (remove takes only an empty folder).
    fs::remove(parent, error);
    return summary.status();
  }
  summary->path = folder;
  summary->bytes = FolderBytes(folder);
  LogLine("backup")
      .Add("name", name)
      .Add("shard", shard)
      .Add("job", job_id.empty() ? "*" : BoundedText(job_id))
      .Add("jobs", summary->jobs.size())
      .Add("bytes", summary->bytes)
      .Add("path", folder);
  return summary;
}

absl::StatusOr<BackupSummary> BackupRoot::Write(const std::string& staging,
                                                const std::string& name,
                                                int shard,
                                                const std::string& job_id) {
  if (absl::Status s = store_->CopyTo(staging); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<RocksDbEngine>> engine =
      RocksDbEngine::Open(staging, /*sync_writes=*/true);
  if (!engine.ok()) return engine.status();
  RocksDbEngine* raw = engine->get();
  // The copy's tables against the checksums their blocks were written
  // with: a byte that the copy changed stops the backup here.
  if (absl::Status s = raw->VerifyChecksums(); !s.ok()) return s;
  auto copy_holder = std::make_unique<KvStateStore>(*std::move(engine));
  KvStateStore& copy = *copy_holder;
  absl::StatusOr<std::vector<StoredJob>> jobs = copy.LoadAll();
  if (!jobs.ok()) return jobs.status();
  std::vector<StoredJob> kept;
  for (StoredJob& job : *jobs) {
    if (job_id.empty() || job.spec.job_id == job_id) {
      kept.push_back(std::move(job));
    } else if (absl::Status s = copy.DeleteJob(job.spec.job_id); !s.ok()) {
      return s;
    }
  }
  if (!job_id.empty()) {
    if (kept.empty()) {
      return absl::NotFoundError(absl::StrCat(
          "job '", BoundedText(job_id), "' not found; nothing to back up"));
    }
    // The other jobs' data out of the files, not only out of sight.
    if (absl::Status s = raw->Compact(); !s.ok()) return s;
  }
  storage::BackupManifest manifest;
  manifest.set_format(kStateFormat);
  manifest.set_name(name);
  manifest.set_shard(shard);
  manifest.set_created_unix_ms(absl::ToUnixMillis(clock_->Now()));
  manifest.set_version(kSyncnormVersion);
  manifest.set_job_id(job_id);
  for (const StoredJob& job : kept) {
    // Kept, and said: restoring it as shard `shard` will leave it out.
    if (absl::Status s = CheckShardOf(job.spec, shard); !s.ok()) {
      LogLine("backup_shard_mismatch")
          .Add("name", name)
          .Add("error", s.message());
    }
    storage::BackupManifestJob* j = manifest.add_jobs();
    j->set_job_record(EncodeJob(job.spec));
    j->set_committed_step(CommittedStepOf(job, &copy));
  }
  copy_holder.reset();
  if (!job_id.empty()) {
    // The store's MANIFEST keeps the key ranges of the files it dropped
    // (the other jobs' ids); opening it again writes a new one from the
    // files that are left.
    absl::StatusOr<std::unique_ptr<RocksDbEngine>> reopened =
        RocksDbEngine::Open(staging, /*sync_writes=*/true);
    if (!reopened.ok()) return reopened.status();
  }
  // Closed: the files are final.
  if (absl::Status s = ListFiles(staging, manifest); !s.ok()) return s;
  if (absl::Status s = WriteManifest(staging, manifest); !s.ok()) return s;
  return ReadManifest(staging);
}

std::vector<BackupSummary> BackupRoot::List(int shard) const {
  std::vector<BackupSummary> out;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(root_, error)) {
    const std::string name = entry.path().filename().string();
    if (!CheckName(name).ok() || !entry.is_directory(error)) continue;
    const std::string folder = FolderOf(name, shard);
    if (!fs::exists(folder, error)) continue;
    absl::StatusOr<BackupSummary> summary = ReadManifest(folder);
    if (!summary.ok()) {
      LogLine("backup_unreadable")
          .Add("path", folder)
          .Add("error", summary.status().message());
      continue;
    }
    out.push_back(*std::move(summary));
  }
  std::sort(out.begin(), out.end(),
            [](const BackupSummary& a, const BackupSummary& b) {
              return std::tie(a.created, a.name) < std::tie(b.created, b.name);
            });
  return out;
}

absl::StatusOr<std::vector<JobImage>> BackupRoot::Read(
    const std::string& name, int shard, const std::string& job_id,
    BackupSummary* summary, std::vector<JobRestore>* left_out) const {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  if (absl::Status s = CheckShard(shard); !s.ok()) return s;
  const std::string folder = FolderOf(name, shard);
  if (!fs::exists(folder)) {
    return absl::NotFoundError(absl::StrCat(
        "no backup '", name, "' of shard ", shard, " in backup_dir '", root_,
        "'; ListBackups shows the backups there"));
  }
  storage::BackupManifest proto;
  absl::StatusOr<BackupSummary> manifest = ReadManifest(folder, &proto);
  if (!manifest.ok()) return manifest.status();
  if (absl::Status s = CheckFiles(folder, proto); !s.ok()) return s;
  absl::StatusOr<std::vector<JobImage>> images = LoadBackup(folder);
  if (!images.ok()) return images.status();
  std::vector<JobImage> out;
  for (JobImage& image : *images) {
    if (!job_id.empty() && image.job.spec.job_id != job_id) continue;
    if (absl::Status s = CheckShardOf(image.job.spec, shard); !s.ok()) {
      if (!job_id.empty()) return s;
      if (left_out != nullptr) {
        left_out->push_back(
            JobRestore{image.job.spec.job_id, false, -1,
                       absl::StrCat("left out: ", s.message())});
      }
      continue;
    }
    out.push_back(std::move(image));
  }
  if (!job_id.empty() && out.empty()) {
    return absl::NotFoundError(absl::StrCat("backup '", name, "' of shard ",
                                            shard, " has no job '",
                                            BoundedText(job_id), "'"));
  }
  if (summary != nullptr) *summary = *std::move(manifest);
  return out;
}

}  // namespace syncnorm
