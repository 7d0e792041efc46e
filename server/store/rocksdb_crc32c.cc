// CRC32C for RocksDB (and the round log, through Crc32c) with the SSE4.2
// instruction, three lanes at a time.
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

// The instruction takes three cycles and can start one per cycle, so one
// register updated word after word runs at a third of its speed. Three
// registers over three consecutive lanes of kLane bytes run at full speed;
// a CRC register's update is linear over GF(2) in the register and the
// data, so the three are then joined exactly: the first, advanced over
// kLane zero bytes, XOR the second, advanced again, XOR the third.
constexpr size_t kLane = 512;

uint64_t Load64(const unsigned char* p) {
  uint64_t word;
  std::memcpy(&word, p, sizeof(word));
  return word;
}

// A register advanced over kLane zero bytes: a linear map, kept as the
// images of each byte position's 256 values.
struct LaneAdvance {
  uint32_t table[4][256];

  uint32_t operator()(uint32_t r) const {
    return table[0][r & 0xff] ^ table[1][(r >> 8) & 0xff] ^
           table[2][(r >> 16) & 0xff] ^ table[3][r >> 24];
  }
};

__attribute__((target("sse4.2"))) LaneAdvance MakeLaneAdvance() {
  uint32_t bit_image[32];
  for (int b = 0; b < 32; ++b) {
    uint64_t r = uint64_t{1} << b;
    for (size_t i = 0; i < kLane; i += 8) r = _mm_crc32_u64(r, 0);
    bit_image[b] = static_cast<uint32_t>(r);
  }
  LaneAdvance advance;
  for (int byte = 0; byte < 4; ++byte) {
    for (int v = 0; v < 256; ++v) {
      uint32_t image = 0;
      for (int b = 0; b < 8; ++b) {
        if ((v >> b) & 1) image ^= bit_image[8 * byte + b];
      }
      advance.table[byte][v] = image;
    }
  }
  return advance;
}

__attribute__((target("sse4.2"))) uint32_t HardwareExtend(uint32_t init_crc,
                                                          const char* data,
                                                          size_t n) {
  static const LaneAdvance advance = MakeLaneAdvance();
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  uint32_t crc = init_crc ^ 0xffffffffu;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = _mm_crc32_u8(crc, *p++);
    --n;
  }
  uint64_t wide = crc;
  for (; n >= 3 * kLane; n -= 3 * kLane, p += 3 * kLane) {
    uint64_t second = 0;
    uint64_t third = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      wide = _mm_crc32_u64(wide, Load64(p + i));
      second = _mm_crc32_u64(second, Load64(p + kLane + i));
      third = _mm_crc32_u64(third, Load64(p + 2 * kLane + i));
    }
    wide = advance(advance(static_cast<uint32_t>(wide)) ^
                   static_cast<uint32_t>(second)) ^
           static_cast<uint32_t>(third);
  }
  for (; n >= 8; n -= 8, p += 8) wide = _mm_crc32_u64(wide, Load64(p));
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
