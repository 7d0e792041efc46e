#include "tests/testing/ctl_runner.h"

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A word for sh: single-quoted.
std::string Quote(const std::string& word) {
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

}  // namespace

CtlResult RunCtl(const std::vector<std::string>& args,
                 const std::string& scratch,
                 const std::vector<std::string>& env) {
  std::string cmd = "env -u SYNCNORM_ADDRESS";
  for (const std::string& e : env) absl::StrAppend(&cmd, " ", Quote(e));
  absl::StrAppend(&cmd, " ", Quote(Runfile("client/ctl/syncnormctl")));
  for (const std::string& a : args) absl::StrAppend(&cmd, " ", Quote(a));
  const std::string out = scratch + "/ctl.out", err = scratch + "/ctl.err";
  absl::StrAppend(&cmd, " >", Quote(out), " 2>", Quote(err));
  const int status = std::system(cmd.c_str());
  CtlResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadAll(out);
  r.err = ReadAll(err);
  return r;
}

}  // namespace syncnorm::testing
