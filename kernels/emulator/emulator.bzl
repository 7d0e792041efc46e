"""The project's .cu sources built as host C++ for the CUDA emulator."""

load("//bazel:copts.bzl", "SYNCNORM_COPTS")

def emulated_cuda_library(name, src, hdrs, deps = [], copts = [], mutant = "none", **kwargs):
    """A cc_library of one .cu source compiled by the host compiler against
    //kernels/emulator's CUDA headers and runtime.

    kernels/emulator/prepare.sh turns the source into a .cc file line for
    line: a #line directive naming the original (diagnostics and the
    emulator's reports point into the .cu file), __shared__ declarations as
    per-block storage, and with `mutant` that planted bug, for the tests
    that show the emulator catching it.

    Args:
      name: the cc_library.
      src: a .cu file of this package.
      hdrs: the headers it includes (.cuh ones too).
      deps: cc deps.
      copts: extra compiler flags.
      mutant: a planted bug of prepare.sh, or "none".
      **kwargs: passed to the cc_library (testonly, ...).
    """
    out = "_emulated/%s/%s.cc" % (name, src[:-len(".cu")])
    native.genrule(
        name = name + "_cc",
        srcs = [src],
        outs = [out],
        tools = ["//kernels/emulator:prepare.sh"],
        cmd = "$(location //kernels/emulator:prepare.sh) %s %s/%s $< $@" % (
            mutant,
            native.package_name(),
            src,
        ),
        testonly = kwargs.get("testonly", False),
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [out],
        textual_hdrs = hdrs,
        # The kernels' #pragma unroll is nvcc's: GCC ignores it, clang tries
        # and warns where the host optimizer cannot.
        copts = SYNCNORM_COPTS + ["-Wno-unknown-pragmas"] + select({
            "//bazel:clang": ["-Wno-pass-failed"],
            "//conditions:default": [],
        }) + copts,
        deps = deps + ["//kernels/emulator"],
        **kwargs
    )
