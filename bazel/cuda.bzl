"""CUDA rules: nvcc from the toolkit at CUDA_ROOT, when it is present.

`cuda_library` compiles .cu files with nvcc (one action per file) into
position-independent objects and wraps them in a cc_library that links the
static CUDA runtime (@syncnorm_system//:cuda_runtime). It is meant to be used only where HAVE_CUDA is true
(see @syncnorm_system//:config.bzl); BUILD files choose a CPU-only alternative
otherwise. Code is generated for sm_90 (SASS) plus compute_90 PTX, which
newer GPUs JIT-compile.
"""

load("@syncnorm_system//:config.bzl", "CUDA_ROOT")
load("//bazel:paths.bzl", "join", "workspace_root")

# sm_90 machine code and compute_90 PTX for later architectures.
CUDA_ARCH_FLAGS = "--generate-code arch=compute_90,code=[sm_90,compute_90]"

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None, **kwargs):
    """A cc_library from .cu sources compiled by nvcc.

    Args:
      name: the cc_library's name.
      srcs: .cu files; each becomes one nvcc action.
      hdrs: headers the .cu files include (also exported by the library).
      deps: cc deps whose headers the .cu files include; only their
        declared headers in this workspace are reachable (list them in
        hdrs of a dependency that nvcc can see through -I.).
      copts: extra nvcc flags.
      visibility: of the cc_library.
      **kwargs: passed to the cc_library (testonly, tags, ...).
    """
    objs = []
    # #include "kernels/..." from the repository's root, also where syncnorm
    # is an external repository of another workspace.
    root = workspace_root()
    for src in srcs:
        stem = src[:-len(".cu")] if src.endswith(".cu") else src
        # Compiled with -fPIC and named .o: Bazel links a precompiled .o
        # that has no .pic.o sibling in both PIC and non-PIC links.
        obj = "_objs_cuda/%s/%s.o" % (name, stem)
        native.genrule(
            name = "%s_%s_nvcc" % (name, stem.replace("/", "_")),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = " ".join([
                "%s/bin/nvcc" % CUDA_ROOT,
                "-ccbin /usr/bin/g++-12",
                "-c -O3 -std=c++17",
                "-Xcompiler -fPIC -Xcompiler -Wall -Xcompiler -Werror",
                "-Werror all-warnings",
                CUDA_ARCH_FLAGS,
                "-I" + (root or "."),
                "-I" + join("$(GENDIR)", root),
                " ".join(copts),
                "-o $@",
                "$(location %s)" % src,
            ]),
            message = "nvcc %s" % src,
            tags = ["cuda"],
            visibility = ["//visibility:private"],
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        # The static CUDA runtime: binaries need no libcudart.so. Linked
        # statically into each binary (never as its own .so), so that the
        # objects that call into libcudart_static.a sit next to it in the
        # link and the runtime's symbols resolve.
        deps = deps + ["@syncnorm_system//:cuda_runtime"],
        linkstatic = True,
        alwayslink = True,
        visibility = visibility,
        **kwargs
    )
