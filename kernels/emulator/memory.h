// The emulator's memory: device and pinned host allocations, each mapped
// between guard pages and poisoned, and the table that finds them by
// address. Not thread-safe: the runtime's lock guards it.
#ifndef SYNCNORM_KERNELS_EMULATOR_MEMORY_H_
#define SYNCNORM_KERNELS_EMULATOR_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>

namespace syncnorm::emu {

struct Pool;

enum class MemoryKind { kDevice, kPinned };

// One allocation: `bytes` at `ptr`, 16-byte aligned, ending at most 15
// bytes before a guard page (a guard page sits before it too). The bytes
// from ptr + bytes to the 16-byte boundary are padding that must stay
// poisoned.
struct Allocation {
  char* ptr = nullptr;
  size_t bytes = 0;
  size_t padded = 0;
  MemoryKind kind = MemoryKind::kDevice;
  int device = 0;
  Pool* pool = nullptr;  // stream-ordered allocations: their pool
  uint64_t id = 0;       // unique for the life of the emulator
  char* mapping = nullptr;
  size_t mapping_bytes = 0;
};

class MemoryTable {
 public:
  MemoryTable() = default;
  ~MemoryTable();
  MemoryTable(const MemoryTable&) = delete;
  MemoryTable& operator=(const MemoryTable&) = delete;

  // A new allocation of `bytes` (>= 1), poisoned; nullptr when the mapping
  // fails.
  Allocation* Map(size_t bytes, MemoryKind kind, int device, Pool* pool);
  // Frees the allocation. Returns "" or what was wrong with it (its padding
  // was written: a write past its end). Its pages stay reserved and
  // inaccessible for a while (the last 256 MiB freed), so that a late
  // access faults instead of reaching a newer allocation.
  std::string Unmap(Allocation* a);

  // The allocation whose bytes [ptr, ptr + bytes] contain p (the end
  // included, for empty ranges), or nullptr.
  Allocation* Find(const void* p) const;
  // The allocation starting exactly at p, or nullptr.
  Allocation* Starting(const void* p) const;
  // Whether [p, p + n) lies inside one allocation; *a gets it (or null).
  bool Contains(const void* p, size_t n, Allocation** a) const;

  // Where p is, for fault messages: in which allocation or guard page.
  std::string Describe(uintptr_t p) const;

  // Unmaps everything.
  void Clear();

 private:
  std::map<uintptr_t, std::unique_ptr<Allocation>> by_ptr_;
  // Freed allocations whose pages are still reserved, oldest first.
  std::deque<std::unique_ptr<Allocation>> freed_;
  size_t freed_bytes_ = 0;
  uint64_t next_id_ = 1;
};

}  // namespace syncnorm::emu

#endif  // SYNCNORM_KERNELS_EMULATOR_MEMORY_H_
