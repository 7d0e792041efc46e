#include "server/store/file_copy.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/store/crc32c.h"

namespace syncnorm {
namespace {

// Large enough that a table file of hundreds of megabytes takes few system
// calls, small enough to cost nothing next to the store's own memory.
constexpr size_t kBufferSize = 1 << 20;

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  const int error = errno;
  const std::string message =
      absl::StrCat("cannot ", what, " '", path, "': ", std::strerror(error));
  if (error == ENOSPC || error == EDQUOT) {
    return absl::ResourceExhaustedError(
        absl::StrCat(message, "; the disk is full: free space, then retry"));
  }
  return absl::UnavailableError(message);
}

// A file descriptor closed when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  const int fd_;
};

absl::Status WriteAll(int fd, const char* data, size_t n,
                      const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return ErrnoError("write", path);
    data += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// The next up to `n` bytes of `fd` into `buffer`; 0 at the end of the file.
absl::StatusOr<size_t> ReadSome(int fd, char* buffer, size_t n,
                                const std::string& path) {
  while (true) {
    const ssize_t r = ::read(fd, buffer, n);
    if (r >= 0) return static_cast<size_t>(r);
    if (errno != EINTR) return ErrnoError("read", path);
  }
}

int CreateNew(const std::string& to) {
  return ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
}

}  // namespace

absl::StatusOr<FileSum> CopyFilePrefix(const std::string& from,
                                       const std::string& to, uint64_t size) {
  Fd in(::open(from.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) return ErrnoError("open", from);
  Fd out(CreateNew(to));
  if (out.get() < 0) return ErrnoError("create", to);
  std::vector<char> buffer(kBufferSize);
  FileSum sum;
  while (sum.size < size) {
    const size_t want =
        static_cast<size_t>(std::min<uint64_t>(buffer.size(), size - sum.size));
    absl::StatusOr<size_t> got = ReadSome(in.get(), buffer.data(), want, from);
    if (!got.ok()) return got.status();
    if (*got == 0) {
      return absl::DataLossError(
          absl::StrCat("'", from, "' ends at byte ", sum.size, " of ", size));
    }
    if (absl::Status s = WriteAll(out.get(), buffer.data(), *got, to);
        !s.ok()) {
      return s;
    }
    sum.crc32c = Crc32c(sum.crc32c, buffer.data(), *got);
    sum.size += *got;
  }
  if (::fsync(out.get()) != 0) return ErrnoError("sync", to);
  return sum;
}

absl::Status WriteNewFile(const std::string& to, const std::string& bytes) {
  Fd out(CreateNew(to));
  if (out.get() < 0) return ErrnoError("create", to);
  if (absl::Status s = WriteAll(out.get(), bytes.data(), bytes.size(), to);
      !s.ok()) {
    return s;
  }
  if (::fsync(out.get()) != 0) return ErrnoError("sync", to);
  return absl::OkStatus();
}

absl::StatusOr<FileSum> SumFile(const std::string& path) {
  Fd in(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("no file '", path, "'"));
    }
    return ErrnoError("open", path);
  }
  std::vector<char> buffer(kBufferSize);
  FileSum sum;
  while (true) {
    absl::StatusOr<size_t> got =
        ReadSome(in.get(), buffer.data(), buffer.size(), path);
    if (!got.ok()) return got.status();
    if (*got == 0) return sum;
    sum.crc32c = Crc32c(sum.crc32c, buffer.data(), *got);
    sum.size += *got;
  }
}

absl::Status SyncPath(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("open", path);
  if (::fsync(fd.get()) != 0) return ErrnoError("sync", path);
  return absl::OkStatus();
}

}  // namespace syncnorm
