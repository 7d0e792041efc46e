"""Repository rules that expose Debian's -dev libraries to Bazel.

`system_libs`: each library becomes a cc_library in @syncnorm_system whose
linkopts come from `pkg-config --libs`; headers live in /usr/include, which
the compiler already searches. Nothing is downloaded. The rule also reports
whether the CUDA build is on, for //kernels to decide between the CUDA and
the CPU-only build: on where the CUDA toolkit is present, unless the
environment says otherwise (`--repo_env=SYNCNORM_CUDA=0`: CPU only even with
nvcc; `=1`: CUDA required, an error without the toolkit).

`system_googletest`: Debian's GoogleTest under the targets of the upstream
repository (`//:gtest`, `//:gtest_main`), for workspaces that have none.
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
    "grpc": (["grpc++", "protobuf"], []),
    "gtest": (["gtest", "gmock"], ["-lpthread"]),
    "gtest_main": (["gtest_main"], []),
    # The aggregator's state store (librocksdb-dev).
    "rocksdb": (["rocksdb"], ["-lpthread"]),
    # The aggregator's metrics (prometheus-cpp-dev): the registry and the
    # text format; server/metrics/metrics_http.cc serves them.
    "prometheus": (["prometheus-cpp-core"], []),
}

_OPTIONAL = []

def _pkg_config(ctx, modules):
    res = ctx.execute(["pkg-config", "--libs"] + modules)
    if res.return_code != 0:
        fail("pkg-config --libs %s failed: %s\nInstall the Debian -dev packages " %
             (" ".join(modules), res.stderr) + "that scripts/deps.sh --build-only installs.")
    seen = []
    for flag in res.stdout.strip().split(" "):
        # pkg-config repeats absl libraries; keep the last occurrence order-safe.
        if flag and flag not in seen:
            seen.append(flag)
    return seen

_CUDA_ROOT = "/usr/local/cuda"

def _find_nccl(ctx):
    """(include dir, lib dir) of NCCL, or None. Looks in the toolkit first."""
    for inc, lib in [
        (_CUDA_ROOT + "/include", _CUDA_ROOT + "/lib64"),
        (_CUDA_ROOT + "/include", _CUDA_ROOT + "/lib"),
        ("/usr/include", "/usr/lib/x86_64-linux-gnu"),
    ]:
        if (ctx.path(inc + "/nccl.h").exists and
            ctx.path(lib + "/libnccl.so").exists):
            return (inc, lib)
    return None

def _cuda_targets(ctx, have_cuda, have_nccl):
    """@syncnorm_system//:cuda_headers, :cuda_runtime and :nccl (empty without CUDA).

    The toolkit's headers are symlinked into this repository so that Bazel's
    header inclusion check accepts them; the CUDA runtime is linked
    statically and NCCL dynamically (with an rpath to its folder).
    """
    if not have_cuda:
        return [
            "# No CUDA toolkit at %s: CPU-only build." % _CUDA_ROOT,
            'cc_library(name = "cuda_headers")',
            'cc_library(name = "cuda_runtime")',
            'cc_library(name = "nccl")',
            "",
        ]
    ctx.symlink(_CUDA_ROOT + "/include", "cuda/include")
    lines = [
        "cc_library(",
        '    name = "cuda_headers",',
        '    hdrs = glob(["cuda/include/*.h", "cuda/include/*.hpp", ' +
        '"cuda/include/crt/**", "cuda/include/nv/**"]),',
        '    includes = ["cuda/include"],',
        ")",
        "",
        "cc_library(",
        '    name = "cuda_runtime",',
        "    linkopts = %r," % [
            "-L%s/lib64" % _CUDA_ROOT,
            "-lcudart_static",
            "-ldl",
            "-lrt",
            "-lpthread",
        ],
        '    deps = [":cuda_headers"],',
        ")",
        "",
    ]
    nccl = _find_nccl(ctx) if have_nccl else None
    if nccl == None:
        lines.append('cc_library(name = "nccl")')
    else:
        # nccl.h is under cuda_headers or in /usr/include, which the
        # compiler searches anyway.
        lib = nccl[1]
        lines += [
            "cc_library(",
            '    name = "nccl",',
            "    linkopts = %r," % ["-L" + lib, "-lnccl", "-Wl,-rpath," + lib],
            '    deps = [":cuda_runtime"],',
            ")",
        ]
    lines.append("")
    return lines

def _cuda_wanted(ctx):
    """Whether to build with CUDA: SYNCNORM_CUDA, else nvcc's presence."""
    have_nvcc = ctx.path(_CUDA_ROOT + "/bin/nvcc").exists
    mode = ctx.os.environ.get("SYNCNORM_CUDA", "auto")
    if mode in ["", "auto"]:
        return have_nvcc
    if mode == "0":
        return False
    if mode == "1":
        if not have_nvcc:
            fail("SYNCNORM_CUDA=1 but there is no CUDA toolkit (%s/bin/nvcc); " %
                 _CUDA_ROOT + "install it, or build with --repo_env=SYNCNORM_CUDA=0")
        return True
    fail("SYNCNORM_CUDA=%r: use 0 (CPU only), 1 (CUDA required) or auto" % mode)

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
    have_cuda = _cuda_wanted(ctx)
    have_nccl = have_cuda and _find_nccl(ctx) != None
    lines += _cuda_targets(ctx, have_cuda, have_nccl)
    ctx.file("BUILD", "\n".join(lines))
    ctx.file("config.bzl", "HAVE_CUDA = %s\nHAVE_NCCL = %s\nCUDA_ROOT = %r\n" %
                           (have_cuda, have_nccl, _CUDA_ROOT))

system_libs = repository_rule(
    implementation = _system_libs_impl,
    local = True,
    environ = ["PKG_CONFIG_PATH", "SYNCNORM_CUDA"],
)

def _system_googletest_impl(ctx):
    gtest = _pkg_config(ctx, ["gtest", "gmock"]) + ["-lpthread"]
    main = _pkg_config(ctx, ["gtest_main"])
    ctx.file("WORKSPACE", "workspace(name = %r)\n" % ctx.name)
    ctx.file("BUILD", "\n".join([
        "# Debian's GoogleTest and GoogleMock (libgtest-dev, libgmock-dev):",
        "# headers in /usr/include, static libraries found by pkg-config.",
        'package(default_visibility = ["//visibility:public"])',
        "",
        "cc_library(name = \"gtest\", linkopts = %r)" % gtest,
        "",
        "cc_library(name = \"gtest_main\", linkopts = %r, deps = [\":gtest\"])" % main,
        "",
    ]))

system_googletest = repository_rule(
    implementation = _system_googletest_impl,
    local = True,
    environ = ["PKG_CONFIG_PATH"],
)
