// Messages of syncnorm.v1 to and from JSON text, the form in which they cross
// into Python (json.loads / json.dumps on the other side).
#ifndef SYNCNORM_CLIENT_PYTHON_SRC_JSON_PROTO_H_
#define SYNCNORM_CLIENT_PYTHON_SRC_JSON_PROTO_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/json_util.h"

namespace syncnorm::python {

// Parses JSON (proto field names or their lowerCamel forms; enums by name
// or number). INVALID_ARGUMENT naming `what` and the parser's complaint.
template <typename M>
absl::StatusOr<M> FromJson(const std::string& json, const char* what) {
  M message;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto s = google::protobuf::util::JsonStringToMessage(json, &message, options);
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad ", what, ": ", s.message().as_string()));
  }
  return message;
}

// JSON with proto field names, every field printed, enums by name.
inline std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  // Printing a well-formed message cannot fail.
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

}  // namespace syncnorm::python

#endif  // SYNCNORM_CLIENT_PYTHON_SRC_JSON_PROTO_H_
