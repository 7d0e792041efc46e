#include "server/domain/bounded_text.h"

#include "absl/strings/str_cat.h"

namespace syncnorm {

std::string BoundedText(absl::string_view text) {
  if (text.size() <= kBoundedTextBytes) return std::string(text);
  size_t keep = kBoundedTextBytes;
  // Back up over UTF-8 continuation bytes (10xxxxxx) to the start of the
  // sequence that would be cut; at most three of them in valid UTF-8.
  for (int i = 0; i < 3 && (text[keep] & 0xC0) == 0x80; ++i) --keep;
  return absl::StrCat(text.substr(0, keep), "... (", text.size(), " bytes)");
}

}  // namespace syncnorm
