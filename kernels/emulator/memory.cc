#include "kernels/emulator/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace syncnorm::emu {
namespace {

constexpr size_t kAlign = 16;
constexpr size_t kQuarantineBytes = 256u << 20;
constexpr unsigned char kPoison = 0xff;  // a NaN in every floating type

size_t Page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

std::string Hex(uintptr_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

const char* KindName(MemoryKind k) {
  return k == MemoryKind::kDevice ? "device" : "pinned host";
}

std::string Name(const Allocation& a) {
  return std::string(KindName(a.kind)) + " allocation of " +
         std::to_string(a.bytes) + " bytes at " +
         Hex(reinterpret_cast<uintptr_t>(a.ptr)) + " (device " +
         std::to_string(a.device) + ")";
}

}  // namespace

MemoryTable::~MemoryTable() { Clear(); }

Allocation* MemoryTable::Map(size_t bytes, MemoryKind kind, int device,
                             Pool* pool) {
  const size_t page = Page();
  const size_t padded = (bytes + kAlign - 1) / kAlign * kAlign;
  const size_t data = (padded + page - 1) / page * page;
  const size_t total = data + 2 * page;
  void* m = mmap(nullptr, total, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  char* mapping = static_cast<char*>(m);
  if (mprotect(mapping + page, data, PROT_READ | PROT_WRITE) != 0) {
    munmap(m, total);
    return nullptr;
  }
  auto a = std::make_unique<Allocation>();
  a->ptr = mapping + page + data - padded;
  a->bytes = bytes;
  a->padded = padded;
  a->kind = kind;
  a->device = device;
  a->pool = pool;
  a->id = next_id_++;
  a->mapping = mapping;
  a->mapping_bytes = total;
  std::memset(a->ptr, kPoison, padded);
  Allocation* raw = a.get();
  by_ptr_[reinterpret_cast<uintptr_t>(raw->ptr)] = std::move(a);
  return raw;
}

std::string MemoryTable::Unmap(Allocation* a) {
  std::string problem;
  for (size_t i = a->bytes; i < a->padded; ++i) {
    if (static_cast<unsigned char>(a->ptr[i]) != kPoison) {
      problem = "a write past the end of the " + Name(*a) + " (byte " +
                std::to_string(i) + " was changed)";
      break;
    }
  }
  // Keep the address range, not the memory.
  madvise(a->mapping, a->mapping_bytes, MADV_DONTNEED);
  mprotect(a->mapping, a->mapping_bytes, PROT_NONE);
  auto it = by_ptr_.find(reinterpret_cast<uintptr_t>(a->ptr));
  freed_bytes_ += a->mapping_bytes;
  freed_.push_back(std::move(it->second));
  by_ptr_.erase(it);
  while (freed_bytes_ > kQuarantineBytes) {
    munmap(freed_.front()->mapping, freed_.front()->mapping_bytes);
    freed_bytes_ -= freed_.front()->mapping_bytes;
    freed_.pop_front();
  }
  return problem;
}

Allocation* MemoryTable::Find(const void* p) const {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  auto it = by_ptr_.upper_bound(v);
  if (it == by_ptr_.begin()) return nullptr;
  --it;
  Allocation* a = it->second.get();
  return v <= it->first + a->bytes ? a : nullptr;
}

Allocation* MemoryTable::Starting(const void* p) const {
  auto it = by_ptr_.find(reinterpret_cast<uintptr_t>(p));
  return it == by_ptr_.end() ? nullptr : it->second.get();
}

bool MemoryTable::Contains(const void* p, size_t n, Allocation** out) const {
  Allocation* a = Find(p);
  *out = a;
  if (a == nullptr) return false;
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  return v + n <= reinterpret_cast<uintptr_t>(a->ptr) + a->bytes;
}

namespace {

// Where p is relative to a, if within its mapping.
bool Locate(uintptr_t p, const Allocation& a, bool freed, std::string* out) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(a.mapping);
  const uintptr_t start = reinterpret_cast<uintptr_t>(a.ptr);
  if (p < lo || p >= lo + a.mapping_bytes) return false;
  const std::string name = (freed ? "freed " : "") + Name(a);
  if (p < start) {
    *out = "address " + Hex(p) + ", " + std::to_string(start - p) +
           " bytes before the " + name;
  } else if (p < start + a.bytes) {
    *out = "address " + Hex(p) + ", byte " + std::to_string(p - start) +
           " of the " + name;
  } else {
    *out = "address " + Hex(p) + ", " + std::to_string(p - start - a.bytes) +
           " bytes past the end of the " + name;
  }
  return true;
}

}  // namespace

std::string MemoryTable::Describe(uintptr_t p) const {
  std::string where;
  for (const auto& [start, a] : by_ptr_) {
    if (Locate(p, *a, false, &where)) return where;
  }
  for (const auto& a : freed_) {
    if (Locate(p, *a, true, &where)) return where;
  }
  return "address " + Hex(p) + ", which is not memory of the emulated device";
}

void MemoryTable::Clear() {
  for (auto& [start, a] : by_ptr_) munmap(a->mapping, a->mapping_bytes);
  by_ptr_.clear();
  for (auto& a : freed_) munmap(a->mapping, a->mapping_bytes);
  freed_.clear();
  freed_bytes_ = 0;
}

}  // namespace syncnorm::emu
