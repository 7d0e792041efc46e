#include "tests/testing/promql.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace syncnorm::testing {
namespace {

using Names = std::set<std::string>;

TEST(MetricNamesTest, SelectorsFunctionsAndAggregations) {
  EXPECT_EQ(MetricNames("up"), Names{"up"});
  EXPECT_EQ(MetricNames("up{job=\"a\"} == 0"), Names{"up"});
  EXPECT_EQ(MetricNames("histogram_quantile(0.99, sum by (le, phase) "
                        "(rate(x_bucket{a=~\"ok|quorum\"}[5m])))"),
            Names{"x_bucket"});
  EXPECT_EQ(MetricNames("sum(rate(a[1m])) by (le) / sum without (b) (c) + "
                        "max by(x) (d)"),
            (Names{"a", "c", "d"}));
}

TEST(MetricNamesTest, BinaryOperatorsAndMatching) {
  EXPECT_EQ(MetricNames("a / on (namespace, pod) group_left () max by "
                        "(namespace, pod) (b{resource=\"memory\"}) > 0.85"),
            (Names{"a", "b"}));
  EXPECT_EQ(MetricNames("a / ignoring (flag) (b{flag=\"max_jobs\"} > 0)"),
            (Names{"a", "b"}));
  EXPECT_EQ(MetricNames("(a > bool 1e6) or on () absent(c) unless d"),
            (Names{"a", "c", "d"}));
  EXPECT_EQ(MetricNames("count(ALERTS{x=\"}{\"}) or vector(0)"),
            Names{"ALERTS"});
  EXPECT_EQ(MetricNames("a offset 1h30m + b @ start() + Inf - NaN"),
            (Names{"a", "b"}));
}

TEST(MetricNamesTest, StringsNameNothing) {
  EXPECT_EQ(MetricNames("label_replace(a, \"dst\", \"$1\", \"src\", "
                        "'(.*) or b')"),
            Names{"a"});
  EXPECT_EQ(MetricNames("{__name__=\"a\"}"), Names{});
  EXPECT_EQ(MetricNames("a:recorded_rate5m * 2"), Names{"a:recorded_rate5m"});
}

}  // namespace
}  // namespace syncnorm::testing
