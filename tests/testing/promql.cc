#include "tests/testing/promql.h"

#include <cctype>

#include "absl/strings/ascii.h"

namespace syncnorm::testing {
namespace {

bool IdentifierStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':';
}

bool IdentifierPart(char c) {
  return IdentifierStart(c) || std::isdigit(static_cast<unsigned char>(c));
}

// The index just past the string literal that starts at `i` (", ' or `).
size_t SkipString(absl::string_view s, size_t i) {
  const char quote = s[i++];
  while (i < s.size() && s[i] != quote) {
    i += (s[i] == '\\' && quote != '`') ? 2 : 1;
  }
  return i + 1;
}

// The index just past the bracket that closes the one at `i`, strings
// inside skipped.
size_t SkipBracketed(absl::string_view s, size_t i) {
  const char open = s[i];
  const char close = open == '{' ? '}' : open == '[' ? ']' : ')';
  int depth = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == '"' || c == '\'' || c == '`') {
      i = SkipString(s, i);
      continue;
    }
    if (c == open) ++depth;
    if (c == close && --depth == 0) return i + 1;
    ++i;
  }
  return i;
}

size_t SkipSpace(absl::string_view s, size_t i) {
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return i;
}

// Keywords that a label list in parentheses follows.
bool TakesLabelList(absl::string_view word) {
  return word == "by" || word == "without" || word == "on" ||
         word == "ignoring" || word == "group_left" || word == "group_right";
}

// Whether the word at `i` is "by" or "without".
bool NextWordGroups(absl::string_view s, size_t i) {
  size_t end = i;
  while (end < s.size() && IdentifierPart(s[end])) ++end;
  const absl::string_view word = s.substr(i, end - i);
  return word == "by" || word == "without";
}

bool IsKeyword(absl::string_view word) {
  const std::string lower = absl::AsciiStrToLower(word);
  return lower == "and" || lower == "or" || lower == "unless" ||
         lower == "bool" || lower == "offset" || lower == "inf" ||
         lower == "nan" || lower == "atan2";
}

}  // namespace

std::set<std::string> MetricNames(absl::string_view expr) {
  std::set<std::string> names;
  size_t i = 0;
  while (i < expr.size()) {
    const char c = expr[i];
    if (c == '"' || c == '\'' || c == '`') {
      i = SkipString(expr, i);
    } else if (c == '{' || c == '[') {
      i = SkipBracketed(expr, i);
    } else if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      // A number or a duration (0.85, 1e6, 0x1f, 5m, 1h30m).
      while (i < expr.size() && (IdentifierPart(expr[i]) || expr[i] == '.')) {
        ++i;
      }
    } else if (IdentifierStart(c)) {
      const size_t start = i;
      while (i < expr.size() && IdentifierPart(expr[i])) ++i;
      const absl::string_view word = expr.substr(start, i - start);
      const size_t next = SkipSpace(expr, i);
      // A call, or an aggregation whose grouping comes first (sum by (x)).
      const bool call = (next < expr.size() && expr[next] == '(') ||
                        NextWordGroups(expr, next);
      if (TakesLabelList(word)) {
        if (call) i = SkipBracketed(expr, next);
      } else if (!call && !IsKeyword(word)) {
        names.emplace(word);
      }
    } else {
      ++i;
    }
  }
  return names;
}

}  // namespace syncnorm::testing
