// A grpc.health.v1.Health/Check call without generated stubs.
#ifndef SYNCNORM_TESTS_TESTING_HEALTH_H_
#define SYNCNORM_TESTS_TESTING_HEALTH_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"

namespace syncnorm::testing {

// The serving status of `service` ("" for the server as a whole): 1 SERVING,
// 2 NOT_SERVING, as in grpc.health.v1.HealthCheckResponse.ServingStatus.
// The request and response are hand-encoded protobuf (one string field, one
// enum field), which keeps this an independent client of the protocol.
absl::StatusOr<int> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& service = "");

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_HEALTH_H_
