#include "server/domain/bounded_text.h"

#include "absl/strings/str_cat.h"

namespace syncnorm {

std::string BoundedText(absl::string_view text) {
  return BoundedText(text, kBoundedTextBytes);
}

std::string BoundedText(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t keep = max_bytes;
  // Back up over UTF-8 continuation bytes (10xxxxxx) to the start of the
  // sequence that would be cut; at most three of them in valid UTF-8.
  for (int i = 0; i < 3 && keep > 0 && (text[keep] & 0xC0) == 0x80; ++i) {
    --keep;
  }
  return absl::StrCat(text.substr(0, keep), "... (", text.size(), " bytes)");
}

}  // namespace syncnorm
