// syncnormctl's command-line grammar.
#include "client/ctl/args.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace syncnorm::ctl {
namespace {

absl::StatusOr<Args> Parse(std::vector<std::string> words) {
  words.insert(words.begin(), "syncnormctl");
  std::vector<const char*> argv;
  for (const std::string& w : words) argv.push_back(w.c_str());
  return ParseArgs(static_cast<int>(argv.size()), argv.data());
}

TEST(ArgsTest, ValuesComeAfterAnEqualsSignOrAsTheNextWord) {
  for (const auto& words : std::vector<std::vector<std::string>>{
           {"checkpoint", "net", "5", "--tag=warm", "--server=a:1",
            "--timeout=3s"},
           {"checkpoint", "--tag", "warm", "net", "--server", "a:1", "5",
            "--timeout", "3s"},
       }) {
    absl::StatusOr<Args> a = Parse(words);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->command, "checkpoint");
    EXPECT_EQ(a->positional, (std::vector<std::string>{"net", "5"}));
    EXPECT_EQ(a->Get("tag"), "warm");
    EXPECT_EQ(a->Get("server"), "a:1");
    EXPECT_EQ(a->Get("timeout"), "3s");
  }
}

TEST(ArgsTest, ShortFormsSwitchesAndTheEndOfOptions) {
  for (const auto& words :
       std::vector<std::vector<std::string>>{{"jobs", "-o", "json"},
                                             {"jobs", "-ojson"},
                                             {"jobs", "-o=json"},
                                             {"jobs", "--output", "json"},
                                             {"jobs", "--output=json"}}) {
    absl::StatusOr<Args> a = Parse(words);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->Get("output"), "json");
    EXPECT_TRUE(*a->Json());
  }
  absl::StatusOr<Args> a = Parse({"-h"});
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->Has("help"));
  a = Parse({"restore-backup", "n", "--replace", "--tls=true", "--version"});
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->Has("replace") && a->Has("tls") && a->Has("version"));
  EXPECT_EQ(a->positional, (std::vector<std::string>{"n"}));
  EXPECT_FALSE(*a->Json());
  a = Parse({"jobs", "--tls=false"});
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->Has("tls"));
  // A switch does not eat the next word; `--` ends the options; a negative
  // number is an argument.
  a = Parse({"restore-backup", "--replace", "n", "--", "--odd-job", "-1"});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->positional, (std::vector<std::string>{"n", "--odd-job", "-1"}));
}

TEST(ArgsTest, MistakesAreUsageErrorsThatSayWhat) {
  struct Case {
    std::vector<std::string> words;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {{"jobs", "--colour=red"}, "unknown option '--colour=red'"},
           {{"jobs", "-x"}, "unknown option '-x'"},
           {{"checkpoint", "net", "5", "--tag"}, "--tag needs a value"},
           {{"checkpoint", "net", "5", "--tag", "--server=a:1"},
            "--tag needs a value"},
           {{"jobs", "-o"}, "-o needs a value"},
           {{"jobs", "--tls=maybe"}, "--tls is a switch"},
       }) {
    absl::StatusOr<Args> a = Parse(c.words);
    ASSERT_FALSE(a.ok()) << c.says;
    EXPECT_TRUE(IsUsage(a.status()));
    EXPECT_TRUE(absl::StrContains(a.status().message(), c.says)) << a.status();
  }
  absl::StatusOr<Args> a = Parse({"jobs", "-o", "yaml"});
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(IsUsage(a->Json().status()));
  a = Parse({"layers", "net", "--group", "-1"});  // a number is a value
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a->Int("group"), -1);
  a = Parse({"layers", "net", "--group", "x"});
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(IsUsage(a->Int("group").status()));
  EXPECT_EQ(*a->Int("step"), std::nullopt);
}

TEST(ArgsTest, MembershipCommandsTakeRanksAndAStep) {
  for (const auto& words : std::vector<std::vector<std::string>>{
           {"join", "net", "3", "5", "--step", "12"},
           {"join", "--step=12", "net", "3", "5"},
       }) {
    absl::StatusOr<Args> a = Parse(words);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->command, "join");
    absl::StatusOr<std::vector<int>> ranks = ParseRanks(*a, 1);
    ASSERT_TRUE(ranks.ok()) << ranks.status();
    EXPECT_EQ(*ranks, (std::vector<int>{3, 5}));
    EXPECT_EQ(*a->Int("step"), 12);
  }
  absl::StatusOr<Args> a = Parse({"leave", "net", "0"});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*ParseRanks(*a, 1), (std::vector<int>{0}));
  EXPECT_EQ(*a->Int("step"), std::nullopt);
}

TEST(ArgsTest, BadRanksAreUsageErrorsThatSayWhich) {
  struct Case {
    std::vector<std::string> words;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {{"join", "net", "x"}, "RANK 'x' is not a rank"},
           {{"join", "net", "-1"}, "RANK '-1' is not a rank"},
           {{"remove", "net", "2", "1.5"}, "RANK '1.5' is not a rank"},
           {{"leave", "net", "4", "2", "4"}, "rank 4 is named twice"},
           {{"join", "net", "99999999999"}, "RANK '99999999999'"},
       }) {
    absl::StatusOr<Args> a = Parse(c.words);
    ASSERT_TRUE(a.ok()) << a.status();
    absl::StatusOr<std::vector<int>> ranks = ParseRanks(*a, 1);
    ASSERT_FALSE(ranks.ok()) << c.says;
    EXPECT_TRUE(IsUsage(ranks.status()));
    EXPECT_TRUE(absl::StrContains(ranks.status().message(), c.says))
        << ranks.status();
  }
}

}  // namespace
}  // namespace syncnorm::ctl
