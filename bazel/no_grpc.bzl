"""no_grpc_test: a target's dependency closure holds no gRPC.

A genquery of deps(target) at build time and a test over its output: the
test fails, naming them, when the closure holds gRPC's libraries
(@syncnorm_system//:grpc, which links grpc++ and grpc) or any generated
service (a cc_grpc_library, its .grpc.pb.h/.grpc.pb.cc, grpc_cpp_plugin).
Generated messages (cc_proto_messages) and protobuf are allowed.
"""

def no_grpc_test(name, target, **kwargs):
    """Defines <name>_deps (the query) and the sh_test <name>.

    Args:
      name: the test's name.
      target: the label whose deps() must hold no gRPC, e.g. ":layer".
      **kwargs: passed to the sh_test (size, tags, ...).
    """
    if target.startswith(":"):
        repo = native.repository_name()
        target = "%s//%s%s" % ("" if repo == "@" else repo, native.package_name(), target)
    native.genquery(
        name = name + "_deps",
        expression = "deps(%s)" % target,
        scope = [target],
        testonly = True,
    )
    native.sh_test(
        name = name,
        srcs = ["//bazel:no_grpc_test.sh"],
        args = [
            "$(location :%s_deps)" % name,
            target,
        ],
        data = [":%s_deps" % name],
        **kwargs
    )
