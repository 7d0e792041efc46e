// syncnormctl run as an operator runs it: the binary, its output and exit
// code.
#ifndef SYNCNORM_TESTS_TESTING_CTL_RUNNER_H_
#define SYNCNORM_TESTS_TESTING_CTL_RUNNER_H_

#include <string>
#include <vector>

namespace syncnorm::testing {

struct CtlResult {
  int code = -1;  // exit code, or 128 + signal
  std::string out, err;
};

// Runs the syncnormctl binary (a runfile of the test) with `args`, each
// passed as one word, and `env` ("NAME=value") added to the environment;
// `scratch` is a folder for its captured output. SYNCNORM_ADDRESS is
// cleared unless `env` sets it.
CtlResult RunCtl(const std::vector<std::string>& args,
                 const std::string& scratch,
                 const std::vector<std::string>& env = {});

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_CTL_RUNNER_H_
