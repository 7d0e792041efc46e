"""cc_grpc_library: C++ messages and gRPC stubs from a .proto, offline.

Runs Debian's protoc with grpc_cpp_plugin in a genrule (no rules_proto, no
downloads) and wraps the generated sources in a cc_library linked against the
system gRPC and protobuf. Works in syncnorm's own workspace and where
syncnorm is an external repository.
"""

load("//bazel:paths.bzl", "join", "workspace_root")

def cc_grpc_library(name, proto, proto_root, deps = [], **kwargs):
    """Generates <proto>.pb.{h,cc} and <proto>.grpc.pb.{h,cc}.

    Args:
      name: the cc_library's name.
      proto: path of the .proto, relative to this package.
      proto_root: the folder (relative to this package) that import paths and
        the generated #include paths are relative to.
      deps: extra cc deps.
      **kwargs: passed to cc_library (visibility, ...).
    """
    if not proto.startswith(proto_root + "/") and proto_root != ".":
        fail("proto %s is not under proto_root %s" % (proto, proto_root))
    rel = proto if proto_root == "." else proto[len(proto_root) + 1:]
    base = rel[:-len(".proto")]
    outs = [join(proto_root, base + ext) for ext in [".pb.h", ".pb.cc", ".grpc.pb.h", ".grpc.pb.cc"]]
    src_root = join(workspace_root(), native.package_name(), proto_root)
    out_root = join("$(RULEDIR)", proto_root)
    native.genrule(
        name = name + "_gen",
        srcs = [proto],
        outs = outs,
        cmd = " ".join([
            "protoc",
            "--proto_path=" + src_root,
            "--cpp_out=" + out_root,
            "--grpc_out=" + out_root,
            "--plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin)",
            "$(location %s)" % proto,
        ]),
    )
    native.cc_library(
        name = name,
        srcs = [outs[1], outs[3]],
        hdrs = [outs[0], outs[2]],
        includes = [proto_root],
        copts = ["-Wno-unused-parameter"],
        deps = ["@syncnorm_system//:grpc", "@syncnorm_system//:protobuf"] + deps,
        **kwargs
    )
