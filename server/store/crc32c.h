// CRC32C (Castagnoli), as RocksDB computes it, with the SSE4.2 instruction
// when the CPU has it (rocksdb_crc32c.cc).
#ifndef SYNCNORM_SERVER_STORE_CRC32C_H_
#define SYNCNORM_SERVER_STORE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace syncnorm {

// The CRC32C of `crc`'s data followed by data[0, n): Crc32c(0, ...) starts.
uint32_t Crc32c(uint32_t crc, const char* data, size_t n);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_STORE_CRC32C_H_
