// `annotation_cases --list` names the cases; `annotation_cases CASE MODE`
// runs one, MODE being `synced` or `racy`. Exit status 2 on bad usage;
// TSan's exitcode (66) when it reported something.
#include <cstdio>
#include <cstring>
#include <vector>

#include "tests/tsan/cases.h"

namespace syncnorm::tsan {

namespace {
int shared_data = 0;
}  // namespace

__attribute__((noinline)) void WriteShared(int v) { shared_data = v; }
__attribute__((noinline)) int ReadShared() { return shared_data; }

}  // namespace syncnorm::tsan

int main(int argc, char** argv) {
  using syncnorm::tsan::Case;
  std::vector<Case> cases = syncnorm::tsan::ExclusionCases();
  for (const Case& c : syncnorm::tsan::HandoffCases()) cases.push_back(c);
  for (const Case& c : syncnorm::tsan::CallbackRequestCases()) {
    cases.push_back(c);
  }
  if (argc == 2 && std::strcmp(argv[1], "--list") == 0) {
    for (const Case& c : cases) std::printf("%s\n", c.name);
    return 0;
  }
  if (argc == 3) {
    const bool racy = std::strcmp(argv[2], "racy") == 0;
    for (const Case& c : cases) {
      if (std::strcmp(argv[1], c.name) != 0) continue;
      if (!racy && std::strcmp(argv[2], "synced") != 0) break;
      c.run(racy);
      return 0;
    }
  }
  std::fprintf(stderr, "usage: %s --list | CASE synced|racy\n", argv[0]);
  return 2;
}
