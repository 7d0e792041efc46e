#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace syncnorm::testing {

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(
    const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!log_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, 2, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
  }
  pid_t pid = 0;
  const int rc =
      posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("cannot start ", argv[0], ": ", std::strerror(rc)));
  }
  return std::unique_ptr<Subprocess>(new Subprocess(pid));
}

Subprocess::~Subprocess() {
  if (reaped_) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
}

void Subprocess::Signal(int sig) {
  if (!reaped_) ::kill(pid_, sig);
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (r < 0) return absl::InternalError(std::strerror(errno));
    if (absl::Now() >= deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      reaped_ = true;
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid_, " still ran after ",
                       absl::FormatDuration(timeout), "; killed it"));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

std::string Runfile(const std::string& path) {
  std::vector<std::string> roots;
  for (const char* var : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    if (const char* v = std::getenv(var)) roots.push_back(v);
  }
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) roots.push_back(std::string(self, n) + ".runfiles");
  for (const std::string& root : roots) {
    const std::string candidate = absl::StrCat(root, "/syncnorm/", path);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::StrCat("bazel-bin/", path);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string MakeScratchDir(const std::string& prefix) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string templ =
      absl::StrCat(base != nullptr ? base : "/tmp", "/", prefix, "-XXXXXX");
  if (::mkdtemp(templ.data()) == nullptr) return "";
  return templ;
}

}  // namespace syncnorm::testing
