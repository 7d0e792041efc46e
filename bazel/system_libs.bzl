"""A repository rule that exposes Debian's -dev libraries to Bazel.

Each library becomes a cc_library in @system whose linkopts come from
`pkg-config --libs`; headers live in /usr/include, which the compiler already
searches. Nothing is downloaded. The rule also reports whether the CUDA toolkit
is present, for //kernels to decide between the CUDA and the CPU-only build.
"""

# target name -> pkg-config modules (and plain -l flags) it links.
_LIBS = {
    "absl": ([
        "absl_flags",
        "absl_flags_parse",
        "absl_status",
        "absl_statusor",
        "absl_strings",
        "absl_str_format",
        "absl_synchronization",
        "absl_time",
        "absl_hash",
        "absl_raw_hash_set",
        "absl_random_random",
    ], []),
    "protobuf": (["protobuf"], []),
    "grpc": (["grpc++", "protobuf"], ["-lgrpc++_reflection"]),
    "gtest": (["gtest", "gmock"], ["-lpthread"]),
    "gtest_main": (["gtest_main"], []),
    "benchmark": (["benchmark"], []),
}

_OPTIONAL = ["rocksdb", "prometheus-cpp-core", "prometheus-cpp-pull"]

def _pkg_config(ctx, modules):
    res = ctx.execute(["pkg-config", "--libs"] + modules)
    if res.return_code != 0:
        fail("pkg-config --libs %s failed: %s\nInstall the Debian -dev packages " %
             (" ".join(modules), res.stderr) + "listed in README.md.")
    seen = []
    for flag in res.stdout.strip().split(" "):
        # pkg-config repeats absl libraries; keep the last occurrence order-safe.
        if flag and flag not in seen:
            seen.append(flag)
    return seen

def _system_libs_impl(ctx):
    lines = ['package(default_visibility = ["//visibility:public"])', ""]
    for name, (modules, extra) in _LIBS.items():
        flags = _pkg_config(ctx, modules) + extra
        lines.append("cc_library(\n    name = %r,\n    linkopts = %r,\n)\n" % (name, flags))
    for module in _OPTIONAL:
        name = module.replace("-", "_")
        if ctx.execute(["pkg-config", "--exists", module]).return_code == 0:
            lines.append("cc_library(\n    name = %r,\n    linkopts = %r,\n)\n" %
                         (name, _pkg_config(ctx, [module])))
    nvcc = ctx.path("/usr/local/cuda/bin/nvcc")
    have_cuda = nvcc.exists
    ctx.file("BUILD", "\n".join(lines))
    ctx.file("config.bzl", "HAVE_CUDA = %s\nCUDA_ROOT = %r\n" % (have_cuda, "/usr/local/cuda"))

system_libs = repository_rule(
    implementation = _system_libs_impl,
    local = True,
    environ = ["PKG_CONFIG_PATH"],
)
