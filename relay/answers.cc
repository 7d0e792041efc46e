#include "relay/answers.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "wire/round_error.h"

namespace syncnorm {

std::vector<int> MissingRanksOf(absl::string_view message) {
  const size_t named = message.rfind("ranks [");
  if (named == absl::string_view::npos) return {};
  absl::string_view list = message.substr(named + 7);
  const size_t end = list.find(']');
  if (end == absl::string_view::npos) return {};
  list = list.substr(0, end);
  std::vector<int> ranks;
  for (absl::string_view piece : absl::StrSplit(list, ", ")) {
    std::pair<absl::string_view, absl::string_view> run =
        absl::StrSplit(piece, absl::MaxSplits('-', 1));
    int first = 0;
    int last = 0;
    if (!absl::SimpleAtoi(run.first, &first)) return {};  // "and N more"
    if (run.second.empty()) {
      last = first;
    } else if (!absl::SimpleAtoi(run.second, &last) || last < first) {
      return {};
    }
    if (!ranks.empty() && first <= ranks.back()) return {};
    for (int r = first; r <= last; ++r) ranks.push_back(r);
  }
  return ranks;
}

RoundAnswer MakeAnswer(v1::RoundResult result) {
  auto answer = std::make_shared<EncodedAnswer>();
  answer->result = std::move(result);
  bool own = false;
  // Serializing a message built here cannot fail (it has no required
  // fields); an empty buffer would reach the rank as an empty result.
  grpc::SerializationTraits<v1::RoundResult>::Serialize(answer->result,
                                                        &answer->bytes, &own)
      .ok();
  return answer;
}

RoundAnswer ErrorAnswer(const v1::Contribution& key,
                        const absl::Status& status) {
  v1::RoundResult out;
  v1::RoundResult* result = &out;
  result->set_job_id(key.job_id());
  result->set_layer(key.layer());
  result->set_step(key.step());
  result->set_phase(key.phase());
  result->set_backward_index(key.backward_index());
  std::vector<int> missing;
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    missing = MissingRanksOf(status.message());
  }
  RoundErrorToProto(status, missing, v1::RoundError::REASON_UNSPECIFIED,
                    *result->mutable_error());
  return MakeAnswer(std::move(out));
}

absl::Status FromGrpc(const grpc::Status& status) {
  // absl and gRPC share the canonical code numbers.
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

grpc::Status UnaryStatus(const v1::RoundResult& answer) {
  if (!answer.has_error()) return grpc::Status::OK;
  const absl::Status status = RoundErrorStatus(answer.error());
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

}  // namespace syncnorm
