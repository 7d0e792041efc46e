// The CUDA kernels' own sources (batch_norm_cuda_*.cu), compiled as host
// C++, run on the strict CPU emulator (kernels/emulator/emulator.h says
// what it enforces) against float64 references: every kernel and option,
// float32/float16/bfloat16, both layouts, ranks 2 to 5, the odd shapes of
// check::OddLayouts, unaligned tensors, and elementwise slicing (its
// bound lowered to 32768 elements). Also: the scratch memory (pools, no
// pools, pinned uploads, no host waits), determinism, the launchers'
// errors, and the emulator catching each planted bug of
// kernels/emulator/prepare.sh in the kernels built with it.
#include <cuda_runtime.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/batch_norm_cuda.h"
#include "kernels/emulated_runner.h"
#include "kernels/emulator/emulator.h"
#include "kernels/kernel_check.h"
#include "kernels/testing/batch_norm_reference.h"

namespace syncnorm {
namespace {

using check::EmulatedRunner;
using check::Layout;
using check::OddLayouts;

const std::vector<DType> kAllTypes = {DType::kFloat32, DType::kFloat16,
                                      DType::kBFloat16};

// A fresh emulator (and fresh launcher caches, which it would invalidate).
void ResetEmulator(const emu::Config& config = emu::Config{}) {
  cuda::ReleaseScratch();
  emu::Reset(config);
}

void ExpectNoFailures(const std::vector<std::string>& failures,
                      const EmulatedRunner& runner) {
  for (const std::string& f : failures) ADD_FAILURE() << f;
  for (const std::string& e : runner.errors()) ADD_FAILURE() << e;
  EXPECT_EQ(emu::Fault(), "");
}

TEST(EmulatedKernels, EveryKernelDTypeAndShapeMatchesFloat64) {
  ResetEmulator();
  EmulatedRunner runner;
  check::Accuracy worst;
  ExpectNoFailures(
      check::CheckKernels(runner, kAllTypes, OddLayouts(),
                          check::GpuTolerance(), /*seed=*/11, &worst),
      runner);
  const emu::Counters c = emu::GetCounters();
  std::printf(
      "worst errors (units of the tolerance's fields): stats %.3g, sums "
      "%.3g, elementwise %.3g; %lld launches, %lld blocks, %lld threads\n",
      worst.stats, worst.sums, worst.out, static_cast<long long>(c.launches),
      static_cast<long long>(c.blocks), static_cast<long long>(c.threads));
}

// Tensors 4 bytes past a 16-byte boundary: the same results without
// vector loads.
TEST(EmulatedKernels, UnalignedTensorsMatchFloat64) {
  ResetEmulator();
  EmulatedRunner runner(/*misalign=*/true);
  const std::vector<Layout> layouts = {{{4, 6, 70, 70}, false},
                                       {{2, 33, 40}, false},
                                       {{2, 7, 7, 300}, true},
                                       {{300, 70}, false}};
  ExpectNoFailures(check::CheckKernels(runner, kAllTypes, layouts,
                                       check::GpuTolerance(), /*seed=*/12),
                   runner);
}

// The same input, aligned or not, twice: the same bits (which thread reads
// what depends on the geometry alone).
TEST(EmulatedKernels, ReductionsAreBitwiseDeterministic) {
  ResetEmulator();
  for (const Layout& l :
       {Layout{{4, 6, 70, 70}, false}, Layout{{64, 40, 3}, true}}) {
    std::vector<double> v(l.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = 300 + (i * 7919 % 1013) / 9.0;
    std::vector<std::vector<double>> means, m2s;
    for (bool misalign : {false, true, false}) {
      EmulatedRunner runner(misalign);
      void* x = runner.Upload(check::Encode(DType::kFloat16, v));
      std::vector<double> mean(l.c()), m2(l.c());
      EXPECT_EQ(runner.Moments(DType::kFloat16, x, l.geometry(), mean.data(),
                               m2.data()),
                "");
      runner.Free(x);
      means.push_back(mean);
      m2s.push_back(m2);
    }
    EXPECT_EQ(means[0], means[1]) << l.Name();
    EXPECT_EQ(means[0], means[2]) << l.Name();
    EXPECT_EQ(m2s[0], m2s[1]) << l.Name();
    EXPECT_EQ(m2s[0], m2s[2]) << l.Name();
  }
}

// |mean| / std = 10^4 in float32: the statistics keep float64 accuracy.
TEST(EmulatedKernels, LargeOffsetsKeepFloat64Accuracy) {
  ResetEmulator();
  EmulatedRunner runner;
  const Layout l{{8, 4, 50, 50}, false};
  std::vector<double> v(l.size());
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(1e4 + std::sin(0.37 * i) + 0.25 * (i % 7));
  }
  void* x = runner.Upload(check::Encode(DType::kFloat32, v));
  std::vector<double> mean(l.c()), m2(l.c());
  ASSERT_EQ(
      runner.Moments(DType::kFloat32, x, l.geometry(), mean.data(), m2.data()),
      "");
  runner.Free(x);
  const reference::Stats ref = reference::Moments(l, v);
  for (int64_t c = 0; c < l.c(); ++c) {
    EXPECT_NEAR(mean[c], static_cast<double>(ref.mean[c]), 1e-12 * 1e4);
    EXPECT_NEAR(m2[c] / static_cast<double>(ref.m2[c]), 1.0, 1e-11)
        << "channel " << c;
  }
}

// Runs `calls` of the launchers and returns the emulator's counters
// before and after.
struct CountersDelta {
  emu::Counters before, after;
};

// The forward and backward of one layer, as the layer calls them.
CountersDelta RunLayerCalls(EmulatedRunner& runner, int repeats) {
  const Layout l{{4, 6, 70, 70}, false};
  const Geometry g = l.geometry();
  std::vector<double> values(l.size());
  for (size_t i = 0; i < values.size(); ++i) values[i] = (i % 97) / 13.0;
  const std::vector<uint8_t> bytes = check::Encode(DType::kFloat32, values);
  void* x = runner.Upload(bytes);
  void* dy = runner.Upload(bytes);
  void* y = runner.Upload(bytes);
  void* gi = runner.Upload(bytes);
  std::vector<double> mean(l.c(), 0.5), invstd(l.c(), 2.0), m2(l.c());
  std::vector<double> s1(l.c()), s2(l.c()), mdy(l.c(), 0.1), mxmu(l.c(), 0.2);
  CountersDelta d;
  d.before = emu::GetCounters();
  for (int r = 0; r < repeats; ++r) {
    EXPECT_EQ(runner.Moments(DType::kFloat32, x, g, mean.data(), m2.data()),
              "");
    ForwardArgs f;
    f.x = x;
    f.y = y;
    f.mean = mean.data();
    f.invstd = invstd.data();
    EXPECT_EQ(runner.Forward(DType::kFloat32, g, f), "");
    BackwardReduceArgs br;
    br.dy = dy;
    br.x = x;
    br.mean = mean.data();
    br.invstd = invstd.data();
    EXPECT_EQ(
        runner.BackwardReduce(DType::kFloat32, g, br, s1.data(), s2.data()),
        "");
    BackwardElementwiseArgs be;
    be.dy = dy;
    be.x = x;
    be.mean = mean.data();
    be.invstd = invstd.data();
    be.mean_dy = mdy.data();
    be.mean_dy_xmu = mxmu.data();
    be.grad_input = gi;
    EXPECT_EQ(runner.BackwardElementwise(DType::kFloat32, g, be), "");
  }
  EXPECT_EQ(cudaStreamSynchronize(runner.stream()), cudaSuccess);
  d.after = emu::GetCounters();
  for (void* p : {x, dy, y, gi}) runner.Free(p);
  return d;
}

// A device without memory pools (cudaMallocAsync fails there): the
// launchers fall back to cached cudaMalloc blocks.
TEST(EmulatedScratch, DevicesWithoutMemoryPoolsUseCachedBlocks) {
  emu::Config config;
  config.memory_pools = false;
  ResetEmulator(config);
  EmulatedRunner runner;
  ExpectNoFailures(
      check::CheckKernels(
          runner, kAllTypes,
          {{{4, 6, 70, 70}, false}, {{64, 40, 3}, true}, {{2, 65536}, false}},
          check::GpuTolerance(), /*seed=*/13),
      runner);
  const CountersDelta d = RunLayerCalls(runner, /*repeats=*/20);
  EXPECT_EQ(d.after.async_mallocs, 0);
  EXPECT_EQ(d.after.pools_created, 0);
  // 80 calls after the sweep reuse the blocks they find: no new ones.
  EXPECT_EQ(d.after.device_mallocs, d.before.device_mallocs);
  EXPECT_EQ(d.after.pinned_allocs, d.before.pinned_allocs);
}

// Where pools exist: one pool of syncnorm's own per device, which keeps
// its memory (release threshold: unlimited); no cudaMalloc per call.
TEST(EmulatedScratch, MemoryPoolKeepsItsMemory) {
  ResetEmulator();
  EmulatedRunner runner;
  const CountersDelta d = RunLayerCalls(runner, /*repeats=*/20);
  ASSERT_EQ(emu::Pools().size(), 1u);
  EXPECT_EQ(emu::Pools()[0].release_threshold,
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(emu::Pools()[0].allocations, 80);
  EXPECT_EQ(d.after.device_mallocs, d.before.device_mallocs);
  EXPECT_LE(d.after.pinned_allocs, 4);  // a few staging blocks, reused
}

// No launcher copies to or from pageable memory (a host wait on a GPU),
// and Forward and BackwardElementwise never synchronize.
TEST(EmulatedScratch, LaunchersNeverWaitOnPageableCopies) {
  ResetEmulator();
  EmulatedRunner runner;
  const Layout l{{4, 6, 70, 70}, false};
  std::vector<double> values(l.size(), 1.0);
  void* x = runner.Upload(check::Encode(DType::kFloat16, values));
  void* y = runner.Upload(check::Encode(DType::kFloat16, values));
  std::vector<double> mean(l.c(), 0.5), invstd(l.c(), 2.0), m2(l.c());
  const emu::Counters before = emu::GetCounters();
  ForwardArgs f;
  f.x = x;
  f.y = y;
  f.mean = mean.data();
  f.invstd = invstd.data();
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(runner.Forward(DType::kFloat16, l.geometry(), f), "");
  }
  const emu::Counters queued = emu::GetCounters();
  EXPECT_EQ(queued.synchronizations, before.synchronizations);
  ASSERT_EQ(
      runner.Moments(DType::kFloat16, x, l.geometry(), mean.data(), m2.data()),
      "");
  const emu::Counters after = emu::GetCounters();
  EXPECT_EQ(after.pageable_uploads, before.pageable_uploads);
  EXPECT_EQ(after.pageable_downloads, before.pageable_downloads);
  runner.Free(x);
  runner.Free(y);
}

// Two Forward calls queued before anything runs, with different
// coefficients: each runs with its own (a staging block is not reused
// while its copy is still queued).
TEST(EmulatedScratch, QueuedCallsKeepTheirOwnCoefficients) {
  ResetEmulator();
  EmulatedRunner runner;
  const Layout l{{2, 3, 40}, false};
  std::vector<double> ones(l.size(), 1.0);
  void* x = runner.Upload(check::Encode(DType::kFloat32, ones));
  void* y1 = runner.Upload(check::Encode(DType::kFloat32, ones));
  void* y2 = runner.Upload(check::Encode(DType::kFloat32, ones));
  std::vector<double> mean(l.c(), 0.0), invstd1(l.c(), 2.0),
      invstd2(l.c(), 3.0);
  ForwardArgs f;
  f.x = x;
  f.mean = mean.data();
  f.y = y1;
  f.invstd = invstd1.data();
  ASSERT_EQ(runner.Forward(DType::kFloat32, l.geometry(), f), "");
  f.y = y2;
  f.invstd = invstd2.data();
  ASSERT_EQ(runner.Forward(DType::kFloat32, l.geometry(), f), "");
  const std::vector<double> out1 = check::Decode(
      DType::kFloat32, runner.Download(y1, l.size() * sizeof(float)));
  const std::vector<double> out2 = check::Decode(
      DType::kFloat32, runner.Download(y2, l.size() * sizeof(float)));
  EXPECT_EQ(out1, std::vector<double>(l.size(), 2.0));
  EXPECT_EQ(out2, std::vector<double>(l.size(), 3.0));
  for (void* p : {x, y1, y2}) runner.Free(p);
}

TEST(EmulatedLaunchers, NoDeviceOrNoDriverIsFailedPrecondition) {
  for (const bool driver : {false, true}) {
    emu::Config config;
    config.driver = driver;
    config.devices = 0;
    ResetEmulator(config);
    std::vector<float> host(24, 1.0f);
    std::vector<double> mean(3), m2(3);
    const cuda::Result r =
        cuda::LocalMoments(nullptr, DType::kFloat32, host.data(),
                           Geometry{2, 3, 4}, mean.data(), m2.data());
    EXPECT_EQ(r.code, cuda::Code::kFailedPrecondition) << r.message;
    EXPECT_NE(r.message.find(driver ? "no CUDA-capable device"
                                    : "driver version is insufficient"),
              std::string::npos)
        << r.message;
  }
  ResetEmulator();
}

TEST(EmulatedLaunchers, HostPointersAndBadArgumentsAreInvalidArgument) {
  ResetEmulator();
  std::vector<float> host(24, 1.0f);
  std::vector<double> mean(3), m2(3);
  cuda::Result r =
      cuda::LocalMoments(nullptr, DType::kFloat32, host.data(),
                         Geometry{2, 3, 4}, mean.data(), m2.data());
  EXPECT_EQ(r.code, cuda::Code::kInvalidArgument);
  EXPECT_NE(r.message.find("host memory"), std::string::npos) << r.message;
  r = cuda::LocalMoments(nullptr, static_cast<DType>(9), host.data(),
                         Geometry{2, 3, 4}, mean.data(), m2.data());
  EXPECT_EQ(r.code, cuda::Code::kInvalidArgument);
  r = cuda::LocalMoments(nullptr, DType::kFloat32, host.data(),
                         Geometry{2, 0, 4}, mean.data(), m2.data());
  EXPECT_EQ(r.code, cuda::Code::kInvalidArgument);
  EXPECT_EQ(emu::Fault(), "");
}

// What a planted-bug binary printed and how it ended.
struct SweepRun {
  int status = -1;
  std::string output;
};

SweepRun RunSweep(const std::string& mutant, const std::string& args) {
  const std::string command =
      "kernels/emulated_sweep_" + mutant + " " + args + " 2>&1";
  SweepRun run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) run.output.append(buf, n);
  const int raw = pclose(pipe);
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return run;
}

bool Has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

struct PlantedBug {
  const char* mutant;
  const char* args;  // the sweep it runs
  // What the report must say: the bug's kind, not just any failure.
  std::vector<std::string> report;
};

class PlantedBugTest : public ::testing::TestWithParam<PlantedBug> {};

// The sweep passes on the kernels as they are, and fails, reporting the
// bug's kind, on the same kernels with the bug planted.
TEST_P(PlantedBugTest, TheEmulatorReportsIt) {
  const PlantedBug& bug = GetParam();
  const SweepRun clean = RunSweep("none", bug.args);
  EXPECT_EQ(clean.status, 0) << clean.output;
  const SweepRun planted = RunSweep(bug.mutant, bug.args);
  EXPECT_EQ(planted.status, 1) << planted.output;
  for (const std::string& part : bug.report) {
    EXPECT_TRUE(Has(planted.output, part))
        << "expected \"" << part << "\" in:\n"
        << planted.output;
  }
  std::printf("planted bug %s, the report:\n%s\n", bug.mutant,
              planted.output.substr(0, 1500).c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Mutants, PlantedBugTest,
    ::testing::Values(
        // A warp merge whose mask leaves lane 31 out: the rendezvous
        // refuses it.
        PlantedBug{"shuffle_mask",
                   "float32 2x33x40_first",
                   {"cudaErrorIllegalInstruction", "__shfl_down_sync",
                    "mask 0x7fffffff", "lane 31"}},
        // A grid-stride loop that skips every other stride: the skipped
        // outputs keep their NaN poison.
        PlantedBug{"grid_stride",
                   "float32 4x6x70x70_first",
                   {"Forward(", "= nan", "BackwardElementwise("}},
        // No barrier before a column merge reads other lanes' partials:
        // it reads poisoned shared memory.
        PlantedBug{
            "missing_barrier",
            "float32 64x40x3_last",
            {"LocalMoments", "nan values of channel", "BackwardReduce"}}),
    [](const ::testing::TestParamInfo<PlantedBug>& info) {
      return std::string(info.param.mutant);
    });

}  // namespace
}  // namespace syncnorm
