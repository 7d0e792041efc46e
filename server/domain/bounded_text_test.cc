#include "server/domain/bounded_text.h"

#include <string>

#include "gtest/gtest.h"

namespace syncnorm {
namespace {

TEST(BoundedTextTest, ShortTextIsWhole) {
  EXPECT_EQ(BoundedText(""), "");
  EXPECT_EQ(BoundedText("resnet50-run7"), "resnet50-run7");
  const std::string longest(kBoundedTextBytes, 'j');
  EXPECT_EQ(BoundedText(longest), longest);
}

TEST(BoundedTextTest, LongTextIsCutAndSized) {
  const std::string huge =
      std::string(kBoundedTextBytes, 'a') + std::string(10 << 20, 'b');
  const std::string shown = BoundedText(huge);
  EXPECT_EQ(shown, std::string(kBoundedTextBytes, 'a') + "... (" +
                       std::to_string(huge.size()) + " bytes)");
  EXPECT_EQ(BoundedText(std::string(kBoundedTextBytes + 1, 'x')),
            std::string(kBoundedTextBytes, 'x') + "... (129 bytes)");
}

TEST(BoundedTextTest, DoesNotCutAUtf8SequenceInTwo) {
  // 127 ASCII bytes, then a 3-byte character across the boundary.
  const std::string text =
      std::string(kBoundedTextBytes - 1, 'a') + "\xE2\x82\xAC" + "tail";
  EXPECT_EQ(BoundedText(text), std::string(kBoundedTextBytes - 1, 'a') +
                                   "... (" + std::to_string(text.size()) +
                                   " bytes)");
  // Bytes that are not UTF-8 at all are cut at most three bytes early.
  const std::string binary(kBoundedTextBytes + 8, '\x80');
  EXPECT_EQ(BoundedText(binary).substr(0, kBoundedTextBytes - 3),
            std::string(kBoundedTextBytes - 3, '\x80'));
  EXPECT_EQ(BoundedText(binary).substr(kBoundedTextBytes - 3),
            "... (136 bytes)");
}

TEST(BoundedTextTest, AnyBound) {
  EXPECT_EQ(BoundedText("abcdef", 6), "abcdef");
  EXPECT_EQ(BoundedText("abcdefg", 4), "abcd... (7 bytes)");
}

}  // namespace
}  // namespace syncnorm
