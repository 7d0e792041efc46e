// How a string a client chose (a job_id, a checkpoint tag, a layer name)
// appears in a status message or a log line: whole up to kBoundedTextBytes,
// cut beyond, so that a request cannot make the server's answer or its log
// as large as itself.
#ifndef SYNCNORM_SERVER_DOMAIN_BOUNDED_TEXT_H_
#define SYNCNORM_SERVER_DOMAIN_BOUNDED_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace syncnorm {

// The longest text shown whole: every valid job_id (at most 128
// characters) is.
inline constexpr size_t kBoundedTextBytes = 128;

// `text` itself when it has at most kBoundedTextBytes bytes; else its first
// kBoundedTextBytes bytes (fewer rather than a UTF-8 sequence cut in two),
// "..." and its size: "aaaa...aaa... (100000 bytes)". Callers quote it as
// they would `text`.
std::string BoundedText(absl::string_view text);

// As BoundedText, with `max_bytes` for kBoundedTextBytes.
std::string BoundedText(absl::string_view text, size_t max_bytes);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_BOUNDED_TEXT_H_
