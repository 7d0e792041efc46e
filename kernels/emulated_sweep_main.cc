// The kernel sweep on the CPU emulator as a program, for
// //kernels:cuda_emulated_test to run on kernels built with a planted bug
// (kernels/emulator/prepare.sh) and on the same kernels without it.
//
// Usage: emulated_sweep DTYPE LAYOUT...   DTYPE: float32, float16 or
// bfloat16; LAYOUT: a name of check::OddLayouts (Layout::Name, e.g.
// 4x6x70x70_first). Prints each failure and the emulator's fault; exit
// status 0 when everything matched the float64 references, 1 when not, 2
// for bad arguments.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/emulated_runner.h"
#include "kernels/emulator/emulator.h"
#include "kernels/kernel_check.h"

int main(int argc, char** argv) {
  using namespace syncnorm;  // NOLINT
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s DTYPE LAYOUT...\n", argv[0]);
    return 2;
  }
  DType dtype;
  if (std::strcmp(argv[1], "float32") == 0) {
    dtype = DType::kFloat32;
  } else if (std::strcmp(argv[1], "float16") == 0) {
    dtype = DType::kFloat16;
  } else if (std::strcmp(argv[1], "bfloat16") == 0) {
    dtype = DType::kBFloat16;
  } else {
    std::fprintf(stderr, "unknown dtype %s\n", argv[1]);
    return 2;
  }
  std::vector<check::Layout> layouts;
  for (int i = 2; i < argc; ++i) {
    bool found = false;
    for (const check::Layout& l : check::OddLayouts()) {
      if (l.Name() == argv[i]) {
        layouts.push_back(l);
        found = true;
      }
    }
    if (!found) {
      std::fprintf(stderr, "unknown layout %s\n", argv[i]);
      return 2;
    }
  }
  emu::Reset();
  check::EmulatedRunner runner;
  std::vector<std::string> failures = check::CheckKernels(
      runner, {dtype}, layouts, check::GpuTolerance(), /*seed=*/7);
  for (const std::string& e : runner.errors()) failures.push_back(e);
  for (const std::string& f : failures) std::printf("FAIL %s\n", f.c_str());
  const std::string fault = emu::Fault();
  if (!fault.empty()) std::printf("FAULT %s\n", fault.c_str());
  std::printf("%zu failure(s)\n", failures.size());
  return failures.empty() && fault.empty() ? 0 : 1;
}
