// Streamed file copies and checksums for backups: a file is read and
// written a buffer at a time, never held whole in memory.
#ifndef SYNCNORM_SERVER_STORE_FILE_COPY_H_
#define SYNCNORM_SERVER_STORE_FILE_COPY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace syncnorm {

// The size and CRC32C (Crc32c) of a file's bytes.
struct FileSum {
  uint64_t size = 0;
  uint32_t crc32c = 0;
};

// Writes the first `size` bytes of `from` to the new file `to` (which must
// not exist) and fsyncs it; returns their sum. DATA_LOSS when `from` is
// shorter than `size`; RESOURCE_EXHAUSTED when the disk of `to` is full;
// UNAVAILABLE for any other error of the file system. Each message names
// the file.
absl::StatusOr<FileSum> CopyFilePrefix(const std::string& from,
                                       const std::string& to, uint64_t size);

// Writes `bytes` to the new file `to` and fsyncs it, with the errors of
// CopyFilePrefix.
absl::Status WriteNewFile(const std::string& to, const std::string& bytes);

// The sum of every byte of `path`. NOT_FOUND when there is no such file,
// UNAVAILABLE when it cannot be read.
absl::StatusOr<FileSum> SumFile(const std::string& path);

// fsync of a file or folder, so that a write or a rename in it survives a
// crash. UNAVAILABLE naming `path` when it fails.
absl::Status SyncPath(const std::string& path);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_STORE_FILE_COPY_H_
