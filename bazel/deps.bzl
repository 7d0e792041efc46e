"""The repositories that syncnorm needs, for its own and any other workspace.

In a workspace that depends on syncnorm (see docs/bazel.md, "Using syncnorm
from your Bazel workspace"):

    local_repository(name = "syncnorm", path = "...")
    load("@syncnorm//bazel:deps.bzl", "syncnorm_dependencies")
    syncnorm_dependencies()

Everything comes from this machine's Debian packages (scripts/deps.sh):
nothing is downloaded, so it works with Debian's Bazel offline
(--experimental_repository_disable_download).
"""

load("//bazel:system_libs.bzl", "system_googletest", "system_libs")

def _files_repository_impl(ctx):
    for path, content in ctx.attr.files.items():
        ctx.file(path, content)

# A repository made of the given files (path -> content).
_files_repository = repository_rule(
    implementation = _files_repository_impl,
    attrs = {"files": attr.string_dict(mandatory = True)},
)

# rules_cc, which Bazel 4's own tools load: its cc rules are native in this
# Bazel, so cc/defs.bzl re-exports them.
_RULES_CC = {
    "WORKSPACE": 'workspace(name = "rules_cc")\n',
    "BUILD": "",
    "cc/BUILD": 'exports_files(["defs.bzl"])\n',
    "cc/defs.bzl": "\n".join([
        '"""Bazel\'s native C++ rules under the rules_cc names."""',
        "",
        "cc_binary = native.cc_binary",
        "cc_import = native.cc_import",
        "cc_library = native.cc_library",
        "cc_proto_library = native.cc_proto_library",
        "cc_test = native.cc_test",
        "cc_toolchain = native.cc_toolchain",
        "cc_toolchain_suite = native.cc_toolchain_suite",
        "fdo_prefetch_hints = native.fdo_prefetch_hints",
        "fdo_profile = native.fdo_profile",
        "objc_import = native.objc_import",
        "objc_library = native.objc_library",
        "",
    ]),
}

# Every test depends on remote_coverage_tools, which Bazel would download;
# `bazel coverage` is not supported, so empty targets do.
_COVERAGE_TOOLS = {
    "WORKSPACE": 'workspace(name = "remote_coverage_tools")\n',
    "BUILD": "\n".join([
        'package(default_visibility = ["//visibility:public"])',
        "",
        'filegroup(name = "coverage_report_generator", srcs = [])',
        "",
        'filegroup(name = "lcov_merger", srcs = [])',
        "",
    ]),
}

# Debian's protoc as @com_google_protobuf//:protoc, the compiler of
# Bazel's native proto_library (//proto:aggregator_proto).
_PROTOBUF = {
    "WORKSPACE": 'workspace(name = "com_google_protobuf")\n',
    "protoc.sh": '#!/bin/sh\nexec /usr/bin/protoc "$@"\n',
    "BUILD": "\n".join([
        'package(default_visibility = ["//visibility:public"])',
        "",
        "# Debian's protobuf-compiler.",
        'sh_binary(name = "protoc", srcs = ["protoc.sh"])',
        "",
    ]),
}

def _maybe(repo_rule, name, **kwargs):
    # A repository defined before the call (by the user) stays as it is.
    if not native.existing_rule(name):
        repo_rule(name = name, **kwargs)

def syncnorm_dependencies():
    """Defines the repositories syncnorm's targets need, unless defined.

    Call it after your own repository definitions: each repository below
    that the workspace already defines is left alone.

    - @syncnorm_system: Debian's gRPC, protobuf, Abseil, RocksDB,
      prometheus-cpp and GoogleTest (pkg-config), and CUDA when nvcc is
      present (--repo_env=SYNCNORM_CUDA=0 builds without it).
    - @com_google_googletest: Debian's GoogleTest as //:gtest and
      //:gtest_main.
    - @com_google_protobuf: //:protoc, Debian's protoc, for proto_library.
    - @rules_cc, @remote_coverage_tools, @rules_java: what Bazel 4 itself
      would otherwise download (rules_java from Debian's bazel-rules-java).
    """
    _maybe(system_libs, "syncnorm_system")
    _maybe(system_googletest, "com_google_googletest")
    _maybe(_files_repository, "com_google_protobuf", files = _PROTOBUF)
    _maybe(_files_repository, "rules_cc", files = _RULES_CC)
    _maybe(_files_repository, "remote_coverage_tools", files = _COVERAGE_TOOLS)
    _maybe(
        native.local_repository,
        "rules_java",
        path = "/usr/share/bazel/rules/java",
    )
