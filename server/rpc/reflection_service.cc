#include "server/rpc/reflection_service.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"

namespace syncnorm {
namespace {

using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;
using grpc::reflection::v1alpha::ServerReflectionRequest;
using grpc::reflection::v1alpha::ServerReflectionResponse;

void Error(grpc::StatusCode code, std::string message,
           ServerReflectionResponse& out) {
  out.mutable_error_response()->set_error_code(static_cast<int>(code));
  out.mutable_error_response()->set_error_message(std::move(message));
}

}  // namespace

// One stream: a read, then its answer's write, then the next read.
// Deletes itself when gRPC is done with it.
class ReflectionService::Reactor final
    : public BidiReactor<ServerReflectionRequest, ServerReflectionResponse> {
 public:
  Reactor(BidiCall<ServerReflectionRequest, ServerReflectionResponse>* call,
          const std::vector<std::string>& services)
      : BidiReactor(call), services_(services) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);  // the client is done, or gone
      return;
    }
    response_.Clear();
    Answer(request_, response_);
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::CANCELLED);
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  void Answer(const ServerReflectionRequest& request,
              ServerReflectionResponse& out) {
    out.set_valid_host(request.host());
    *out.mutable_original_request() = request;
    const DescriptorPool* pool = DescriptorPool::generated_pool();
    switch (request.message_request_case()) {
      case ServerReflectionRequest::kFileByFilename:
        return SendFile(pool->FindFileByName(request.file_by_filename()),
                        absl::StrCat("file '", request.file_by_filename(), "'"),
                        out);
      case ServerReflectionRequest::kFileContainingSymbol:
        return SendFile(
            pool->FindFileContainingSymbol(request.file_containing_symbol()),
            absl::StrCat("symbol '", request.file_containing_symbol(), "'"),
            out);
      case ServerReflectionRequest::kFileContainingExtension: {
        const auto& e = request.file_containing_extension();
        const auto* type = pool->FindMessageTypeByName(e.containing_type());
        const auto* extension =
            type == nullptr
                ? nullptr
                : pool->FindExtensionByNumber(type, e.extension_number());
        return SendFile(extension == nullptr ? nullptr : extension->file(),
                        absl::StrCat("extension ", e.extension_number(),
                                     " of '", e.containing_type(), "'"),
                        out);
      }
      case ServerReflectionRequest::kAllExtensionNumbersOfType: {
        const auto* type = pool->FindMessageTypeByName(
            request.all_extension_numbers_of_type());
        if (type == nullptr) {
          return Error(
              grpc::StatusCode::NOT_FOUND,
              absl::StrCat("type '", request.all_extension_numbers_of_type(),
                           "' not found"),
              out);
        }
        std::vector<const google::protobuf::FieldDescriptor*> extensions;
        pool->FindAllExtensions(type, &extensions);
        auto* numbers = out.mutable_all_extension_numbers_response();
        numbers->set_base_type_name(type->full_name());
        for (const auto* f : extensions)
          numbers->add_extension_number(f->number());
        return;
      }
      case ServerReflectionRequest::kListServices:
        for (const std::string& name : services_) {
          out.mutable_list_services_response()->add_service()->set_name(name);
        }
        return;
      case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
        return Error(grpc::StatusCode::INVALID_ARGUMENT,
                     "the request asks for nothing: set one of "
                     "file_by_filename, file_containing_symbol, "
                     "file_containing_extension, "
                     "all_extension_numbers_of_type, list_services",
                     out);
    }
  }

  // `file` and the files it imports, those not sent on this stream yet;
  // NOT_FOUND naming `what` when there is no `file`.
  void SendFile(const FileDescriptor* file, const std::string& what,
                ServerReflectionResponse& out) {
    if (file == nullptr) {
      return Error(grpc::StatusCode::NOT_FOUND,
                   absl::StrCat(what, " not found"), out);
    }
    auto* files = out.mutable_file_descriptor_response();
    std::vector<const FileDescriptor*> todo = {file};
    while (!todo.empty()) {
      const FileDescriptor* f = todo.back();
      todo.pop_back();
      if (!sent_.insert(f->name()).second) continue;
      google::protobuf::FileDescriptorProto proto;
      f->CopyTo(&proto);
      proto.SerializeToString(files->add_file_descriptor_proto());
      for (int i = 0; i < f->dependency_count(); ++i) {
        todo.push_back(f->dependency(i));
      }
    }
  }

  const std::vector<std::string>& services_;
  // Only one read or write is outstanding at a time: these need no lock.
  ServerReflectionRequest request_;
  ServerReflectionResponse response_;
  absl::flat_hash_set<std::string> sent_;  // file names
};

ReflectionService::ReflectionService(std::vector<std::string> services)
    : services_(std::move(services)) {}

ReflectionService::~ReflectionService() = default;

void ReflectionService::Listen(RpcLoop* loop) {
  method_ = std::make_unique<Call::Method>();
  method_->request =
      Call::Requester(this, &grpc::reflection::v1alpha::ServerReflection::
                                AsyncService::RequestServerReflectionInfo);
  method_->start = [this](Call* call) {
    new Reactor(call, services_);  // deletes itself
  };
  Call::Listen(loop, method_.get());
}

}  // namespace syncnorm
