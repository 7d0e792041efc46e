#include "server/memory_trimmer.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace syncnorm {

MemoryTrimmer::MemoryTrimmer(absl::Duration period)
    : thread_(period, &MemoryTrimmer::Trim) {}

MemoryTrimmer::~MemoryTrimmer() = default;

void MemoryTrimmer::Trim() {
#if defined(__GLIBC__)
  // Releases free pages of every arena, not only the top of the main heap;
  // takes each arena's lock briefly.
  malloc_trim(0);
#endif
}

}  // namespace syncnorm
