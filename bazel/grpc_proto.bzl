"""C++ messages and gRPC stubs from a .proto, offline.

Runs Debian's protoc (with grpc_cpp_plugin for the stubs) in genrules (no
rules_proto, no downloads) and wraps the generated sources in cc_librarys
linked against the system protobuf (and gRPC, for the stubs). Works in
syncnorm's own workspace and where syncnorm is an external repository.
"""

load("//bazel:paths.bzl", "join", "workspace_root")

def _generate(name, proto, proto_root, out_flag, exts, extra_args = []):
    """A genrule running protoc with `out_flag`; returns its outputs."""
    if not proto.startswith(proto_root + "/") and proto_root != ".":
        fail("proto %s is not under proto_root %s" % (proto, proto_root))
    rel = proto if proto_root == "." else proto[len(proto_root) + 1:]
    base = rel[:-len(".proto")]
    outs = [join(proto_root, base + ext) for ext in exts]
    src_root = join(workspace_root(), native.package_name(), proto_root)
    out_root = join("$(RULEDIR)", proto_root)
    native.genrule(
        name = name,
        srcs = [proto],
        outs = outs,
        cmd = " ".join([
            "protoc",
            "--proto_path=" + src_root,
            out_flag + "=" + out_root,
        ] + extra_args + ["$(location %s)" % proto]),
    )
    return outs

def cc_proto_messages(name, proto, proto_root, **kwargs):
    """Generates <proto>.pb.{h,cc}: the messages alone, no gRPC.

    Args:
      name: the cc_library's name.
      proto: path of the .proto, relative to this package.
      proto_root: the folder (relative to this package) that import paths and
        the generated #include paths are relative to.
      **kwargs: passed to cc_library (visibility, ...).
    """
    outs = _generate(name + "_gen", proto, proto_root, "--cpp_out", [".pb.h", ".pb.cc"])
    native.cc_library(
        name = name,
        srcs = [outs[1]],
        hdrs = [outs[0]],
        includes = [proto_root],
        copts = ["-Wno-unused-parameter"],
        deps = ["@syncnorm_system//:protobuf"],
        **kwargs
    )

def cc_grpc_library(name, proto, proto_root, messages = None, deps = [], **kwargs):
    """Generates <proto>.grpc.pb.{h,cc} over the messages' library.

    Args:
      name: the cc_library of the stubs (it exports the messages too).
      proto: path of the .proto, relative to this package.
      proto_root: the folder (relative to this package) that import paths and
        the generated #include paths are relative to.
      messages: the name of the messages' cc_library, which this macro
        defines (cc_proto_messages) with the same kwargs; default
        name + "_messages". Code that needs only the messages depends on it
        and stays free of gRPC.
      deps: extra cc deps of the stubs.
      **kwargs: passed to both cc_librarys (visibility, ...).
    """
    messages = messages or name + "_messages"
    cc_proto_messages(name = messages, proto = proto, proto_root = proto_root, **kwargs)
    outs = _generate(
        name + "_gen",
        proto,
        proto_root,
        "--grpc_out",
        [".grpc.pb.h", ".grpc.pb.cc"],
        ["--plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin)"],
    )
    native.cc_library(
        name = name,
        srcs = [outs[1]],
        hdrs = [outs[0]],
        includes = [proto_root],
        copts = ["-Wno-unused-parameter"],
        deps = [
            ":" + messages,
            "@syncnorm_system//:grpc",
            "@syncnorm_system//:protobuf",
        ] + deps,
        **kwargs
    )
