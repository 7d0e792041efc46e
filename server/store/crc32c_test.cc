// The CRC32C that RocksDB computes in this process
// (server/store/rocksdb_crc32c.cc when linked in) against an independent
// bitwise implementation, and the check that RocksDB's calls reach it.
#include <dlfcn.h>

#include <cstdint>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace rocksdb {
namespace crc32c {
uint32_t Extend(uint32_t init_crc, const char* data, size_t n);
}  // namespace crc32c
}  // namespace rocksdb

namespace syncnorm {
namespace {

// CRC-32C (Castagnoli), reflected, one bit at a time.
uint32_t BitwiseExtend(uint32_t init_crc, const std::string& data) {
  uint32_t crc = ~init_crc;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
  }
  return ~crc;
}

TEST(Crc32cTest, KnownValue) {
  // The check value of CRC-32C (RFC 3720, B.4 and the Rocksoft catalogue).
  const std::string digits = "123456789";
  EXPECT_EQ(BitwiseExtend(0, digits), 0xE3069283u);
  EXPECT_EQ(rocksdb::crc32c::Extend(0, digits.data(), digits.size()),
            0xE3069283u);
}

TEST(Crc32cTest, MatchesTheBitwiseReferenceAtEveryLengthAndAlignment) {
  std::mt19937_64 rng(20261130);
  std::string buffer(65536 + 64, '\0');
  for (char& c : buffer) c = static_cast<char>(rng());
  for (size_t offset = 0; offset < 16; ++offset) {
    // Around the three-lane blocks (1,536 bytes) too, and past a round
    // log record's size at 2,048 channels (64 KiB).
    for (size_t n : {0,    1,    2,    3,    7,    8,    9,    15,   16,
                     17,   63,   64,   65,   255,  1000, 1535, 1536, 1537,
                     1543, 3071, 3072, 3073, 4096, 4609, 65549}) {
      const std::string piece = buffer.substr(offset, n);
      const uint32_t init = static_cast<uint32_t>(rng());
      ASSERT_EQ(rocksdb::crc32c::Extend(init, buffer.data() + offset, n),
                BitwiseExtend(init, piece))
          << "offset " << offset << " length " << n;
    }
  }
  // Extending in pieces equals one pass over the whole.
  const uint32_t first = rocksdb::crc32c::Extend(0, buffer.data(), 1001);
  EXPECT_EQ(rocksdb::crc32c::Extend(first, buffer.data() + 1001, 3000),
            BitwiseExtend(0, buffer.substr(0, 4001)));
}

TEST(Crc32cTest, RocksDbCallsReachOurDefinitionNotItsOwn) {
  // librocksdb calls Extend through its PLT, which binds to the first
  // definition in global lookup order: ours, which comes before librocksdb
  // (in the executable, or in a library it loads first).
  const char* name = "_ZN7rocksdb6crc32c6ExtendEjPKcm";
  void* bound = dlsym(RTLD_DEFAULT, name);
  ASSERT_NE(bound, nullptr);
  void* rocksdb = dlopen("librocksdb.so.7.8", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(rocksdb, nullptr) << "librocksdb is not loaded: " << dlerror();
  // Lookup in that library's own scope finds its own definition first.
  void* own = dlsym(rocksdb, name);
  dlclose(rocksdb);
  ASSERT_NE(own, nullptr);
  Dl_info bound_info, own_info;
  ASSERT_NE(dladdr(bound, &bound_info), 0);
  ASSERT_NE(dladdr(own, &own_info), 0);
  EXPECT_NE(bound, own) << "RocksDB's calls reach " << bound_info.dli_fname;
  EXPECT_EQ(std::string(bound_info.dli_fname).find("librocksdb.so"),
            std::string::npos)
      << bound_info.dli_fname;
  EXPECT_NE(std::string(own_info.dli_fname).find("librocksdb.so"),
            std::string::npos)
      << own_info.dli_fname;
}

}  // namespace
}  // namespace syncnorm
