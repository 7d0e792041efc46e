#include "server/metrics/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "server/metrics/families.h"
#include "server/rpc/read_flood.h"

namespace syncnorm {
namespace {

prometheus::MetricFamily Family(std::string name, std::string help,
                                prometheus::MetricType type, double value) {
  prometheus::MetricFamily family =
      NewFamily(std::move(name), std::move(help), type);
  AddSample(family, value);
  return family;
}

std::string ReadProcFile(const char* path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Seconds since the epoch at which the process started: its start in clock
// ticks after boot (/proc/self/stat, field 22) plus the boot time
// (/proc/stat, btime).
std::optional<double> StartTime() {
  const std::string stat = ReadProcFile("/proc/self/stat");
  // The command name, field 2, is in parentheses and may hold spaces.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::vector<absl::string_view> f = absl::StrSplit(
      absl::string_view(stat).substr(close + 1), ' ', absl::SkipEmpty());
  // f[0] is field 3 (state), so field 22 is f[19].
  int64_t ticks = 0;
  if (f.size() < 20 || !absl::SimpleAtoi(f[19], &ticks)) return std::nullopt;
  for (absl::string_view line :
       absl::StrSplit(ReadProcFile("/proc/stat"), '\n')) {
    int64_t boot = 0;
    if (absl::ConsumePrefix(&line, "btime ") && absl::SimpleAtoi(line, &boot)) {
      return static_cast<double>(boot) +
             static_cast<double>(ticks) /
                 static_cast<double>(::sysconf(_SC_CLK_TCK));
    }
  }
  return std::nullopt;
}

std::optional<double> OpenFds() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return std::nullopt;
  int64_t n = 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return static_cast<double>(n - 1);  // less the one opendir holds
}

}  // namespace

std::vector<prometheus::MetricFamily> CollectProcessMetrics() {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  if (const ProcessMemory m = ReadProcessMemory(); m.virtual_size > 0) {
    out.push_back(Family("process_resident_memory_bytes",
                         "Resident memory size in bytes.", MetricType::Gauge,
                         static_cast<double>(m.resident)));
    out.push_back(Family("process_virtual_memory_bytes",
                         "Virtual memory size in bytes.", MetricType::Gauge,
                         static_cast<double>(m.virtual_size)));
  }
  timespec cpu{};
  if (::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu) == 0) {
    out.push_back(Family("process_cpu_seconds_total",
                         "Total user and system CPU time spent in seconds.",
                         MetricType::Counter,
                         static_cast<double>(cpu.tv_sec) +
                             static_cast<double>(cpu.tv_nsec) * 1e-9));
  }
  if (std::optional<double> fds = OpenFds()) {
    out.push_back(Family("process_open_fds", "Number of open file descriptors.",
                         MetricType::Gauge, *fds));
  }
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 &&
      files.rlim_cur != RLIM_INFINITY) {
    out.push_back(
        Family("process_max_fds", "Maximum number of open file descriptors.",
               MetricType::Gauge, static_cast<double>(files.rlim_cur)));
  }
  // Read once: it does not change.
  static const std::optional<double> start_time = StartTime();
  if (start_time.has_value()) {
    out.push_back(Family("process_start_time_seconds",
                         "Start time of the process since unix epoch in "
                         "seconds.",
                         MetricType::Gauge, *start_time));
  }
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
  // Walks every arena under its lock: about as long as a trim's walk. All
  // zeros when another allocator serves malloc (a sanitizer's, a preloaded
  // one): then glibc's heap says nothing of the server's.
  const struct mallinfo2 heap = ::mallinfo2();
  if (heap.arena + heap.hblkhd == 0) return out;
  prometheus::MetricFamily bytes = NewFamily(
      "syncnorm_heap_bytes",
      "The heap: allocated (what the server's objects hold, mmapped blocks "
      "included) and free (what malloc holds for reuse; the server gives "
      "its free pages back to the kernel every 5 s). Resident memory well "
      "above allocated is free memory not yet given back.",
      MetricType::Gauge);
  AddSample(bytes, static_cast<double>(heap.uordblks + heap.hblkhd),
            {{"state", "allocated"}});
  AddSample(bytes, static_cast<double>(heap.fordblks), {{"state", "free"}});
  out.push_back(std::move(bytes));
#endif
  return out;
}

}  // namespace syncnorm
