// Child processes for system tests and the demo.
#ifndef SYNCNORM_TESTS_TESTING_SUBPROCESS_H_
#define SYNCNORM_TESTS_TESTING_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace syncnorm::testing {

// A started child process. The destructor kills (SIGKILL) and reaps it if
// it still runs, so no test leaves processes behind.
class Subprocess {
 public:
  // Starts argv[0] (a path) with the arguments. stderr goes to the parent's
  // unless log_path is set.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(
      const std::vector<std::string>& argv, const std::string& log_path = "");
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int sig);
  // Waits up to `timeout` for the exit; returns the exit code, or 128 +
  // signal number. DEADLINE_EXCEEDED (and the child killed) on timeout.
  absl::StatusOr<int> Wait(absl::Duration timeout);

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
  bool reaped_ = false;
};

// Path of a file built by Bazel, e.g. "server/syncnorm-aggregator", found
// through the test's or the binary's runfiles.
std::string Runfile(const std::string& path);

// What the file at `path` holds; "" when it cannot be read.
std::string ReadFile(const std::string& path);

// A fresh scratch folder (under TEST_TMPDIR when set).
std::string MakeScratchDir(const std::string& prefix);

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_SUBPROCESS_H_
