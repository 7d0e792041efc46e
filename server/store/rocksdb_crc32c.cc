// CRC32C for RocksDB with the SSE4.2 instruction.
//
// Debian's RocksDB 7.8 is built for baseline x86-64, so the CRC32C it
// computes over every write-ahead-log record and every table block runs its
// portable table-driven loop: about a tenth of the aggregator's CPU at 2048
// channels, on every round's critical path (perf, bench/RESULTS.md).
// RocksDB reaches it through rocksdb::crc32c::Extend, an exported function
// that the library itself calls through its PLT; a definition in the
// executable takes precedence for every such call (ELF symbol
// interposition), so defining it here swaps in the hardware instruction
// without rebuilding RocksDB. Same polynomial (Castagnoli), same
// pre/post inversion, hence the same values: crc32c_test checks them against
// an independent bitwise implementation. Without SSE4.2 it forwards to
// RocksDB's own.
#include <dlfcn.h>
#include <nmmintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "server/store/crc32c.h"

namespace rocksdb {
namespace crc32c {
uint32_t Extend(uint32_t init_crc, const char* data, size_t n);
}  // namespace crc32c
}  // namespace rocksdb

namespace syncnorm {
namespace {

using ExtendFunction = uint32_t (*)(uint32_t, const char*, size_t);

__attribute__((target("sse4.2"))) uint32_t HardwareExtend(uint32_t init_crc,
                                                          const char* data,
                                                          size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  uint32_t crc = init_crc ^ 0xffffffffu;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = _mm_crc32_u8(crc, *p++);
    --n;
  }
  uint64_t wide = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, sizeof(word));
    wide = _mm_crc32_u64(wide, word);
  }
  crc = static_cast<uint32_t>(wide);
  for (; n > 0; --n) crc = _mm_crc32_u8(crc, *p++);
  return crc ^ 0xffffffffu;
}

ExtendFunction Choose() {
  if (__builtin_cpu_supports("sse4.2")) return HardwareExtend;
  // RocksDB's own definition, the next one in lookup order.
  return reinterpret_cast<ExtendFunction>(
      dlsym(RTLD_NEXT, "_ZN7rocksdb6crc32c6ExtendEjPKcm"));
}

}  // namespace
}  // namespace syncnorm

uint32_t rocksdb::crc32c::Extend(uint32_t init_crc, const char* data,
                                 size_t n) {
  static const syncnorm::ExtendFunction chosen = syncnorm::Choose();
  return chosen(init_crc, data, n);
}

uint32_t syncnorm::Crc32c(uint32_t crc, const char* data, size_t n) {
  return rocksdb::crc32c::Extend(crc, data, n);
}
