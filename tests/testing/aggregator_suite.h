// A test fixture whose whole suite shares one aggregator process (the binary,
// tests/testing/cluster.h) in a scratch dir of its own, started before the
// suite's first test and stopped after its last, where a graceful exit on
// SIGTERM is checked too.
//
//   class SystemTest : public AggregatorSuite<SystemTest> {
//    public:
//     static constexpr char kScratchName[] = "system";
//     static std::vector<std::string> AggregatorFlags() { return {...}; }
//   };
//
// A suite that needs more set-up defines its own SetUpTestSuite and calls
// AggregatorSuite::SetUpTestSuite first.
#ifndef SYNCNORM_TESTS_TESTING_AGGREGATOR_SUITE_H_
#define SYNCNORM_TESTS_TESTING_AGGREGATOR_SUITE_H_

#include <memory>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "tests/testing/cluster.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {

template <typename Suite>
class AggregatorSuite : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = MakeScratchDir(Suite::kScratchName);
    auto a = AggregatorProcess::Start(dir_, Suite::AggregatorFlags());
    ASSERT_TRUE(a.ok()) << a.status();
    aggregator_ = std::move(*a);
  }
  static void TearDownTestSuite() {
    if (aggregator_ == nullptr) return;
    auto code = aggregator_->Stop();
    EXPECT_TRUE(code.ok() && *code == 0) << "graceful stop on SIGTERM";
    aggregator_.reset();
  }

 protected:
  // The suite's scratch dir (the aggregator's log is aggregator.log there).
  static const std::string& dir() { return dir_; }
  static AggregatorProcess& aggregator() { return *aggregator_; }

 private:
  static inline std::string dir_;
  static inline std::unique_ptr<AggregatorProcess> aggregator_;
};

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_AGGREGATOR_SUITE_H_
