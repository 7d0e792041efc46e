// The round log's and RocksDB's CRC32C (server/store/rocksdb_crc32c.cc)
// against one register stepping through the same bytes with the same
// SSE4.2 instruction, timed in the same process. Prints, per size:
//   CRC <bytes> <ours ns> <one-lane ns>
// (best of --reps passes, each over enough calls for ~1 ms), after checking
// that both give the same value.
#include <nmmintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/best_nanos.h"
#include "server/store/crc32c.h"

ABSL_FLAG(int, reps, 15, "timed passes per size; the best counts");

namespace {

// One register, one word after another: each instruction waits for the
// previous one's result.
__attribute__((target("sse4.2"))) uint32_t OneLane(uint32_t crc,
                                                   const char* data, size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  uint64_t wide = crc ^ 0xffffffffu;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, sizeof(word));
    wide = _mm_crc32_u64(wide, word);
  }
  uint32_t narrow = static_cast<uint32_t>(wide);
  for (; n > 0; --n) narrow = _mm_crc32_u8(narrow, *p++);
  return narrow ^ 0xffffffffu;
}

template <typename F>
double BestNanos(F f, const std::string& buffer, size_t n, int reps) {
  const int calls = static_cast<int>(std::max<size_t>(1, (1 << 20) / n));
  return syncnorm::bench::BestNanosPerCall(
      [&](uint64_t sink) {
        return f(static_cast<uint32_t>(sink), buffer.data(), n);
      },
      calls, reps);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!__builtin_cpu_supports("sse4.2")) {
    std::printf("SKIP no SSE4.2 on this CPU\n");
    return 0;
  }
  std::mt19937_64 rng(20261202);
  std::string buffer(1 << 20, '\0');
  for (char& c : buffer) c = static_cast<char>(rng());
  const int reps = absl::GetFlag(FLAGS_reps);
  // A round log record at 256 and 2,048 channels; a RocksDB table block
  // and write-ahead-log chunk sizes lie between.
  for (size_t n :
       {size_t{1536}, size_t{8} << 10, size_t{64} << 10, size_t{1} << 20}) {
    if (syncnorm::Crc32c(0, buffer.data(), n) != OneLane(0, buffer.data(), n)) {
      std::fprintf(stderr, "bench-crc32c: the two differ at %zu bytes\n", n);
      return 1;
    }
    std::printf("CRC %zu %.1f %.1f\n", n,
                BestNanos(syncnorm::Crc32c, buffer, n, reps),
                BestNanos(OneLane, buffer, n, reps));
  }
  return 0;
}
