"""layering_test: what one layer of the server must not depend on, checked.

The server's layers (server/domain, store, rpc, metrics) forbid what the
design forbids; visibility stops a direct dependency, and this test stops
one that comes in further down, through a dependency's dependencies.
"""

# TSAN_DEPS (bazel/tsan.bzl): every test carries the sanitizer annotations,
# which link gRPC's, under --config=tsan; a query sees both branches of
# that select, so their edges are left out of the closure.
_TSAN = ["//tests/tsan:sync_annotations", "//tests/tsan:enabled"]

def layering_test(name, package, targets, forbidden):
    """A test that fails when a target of `package` depends on a forbidden one.

    Args:
      name: the test's name; its query is `name + "_deps"`.
      package: the layer's package, e.g. "//server/domain".
      targets: the name of every rule of `package`. The query covers
        `package:all`, so a rule missing from this list fails the build
        ("not within the scope of the query") until it is listed.
      forbidden: extended regular expressions matched against whole
        labels; a label of the layer's dependency closure that matches one
        fails the test, which names it.
    """
    layer = package + ":all"
    native.genquery(
        name = name + "_deps",
        testonly = True,
        expression = (
            "let layer = {layer} in " +
            "deps((deps($layer, 1) except $layer) except ({tsan})) + $layer"
        ).format(layer = layer, tsan = " + ".join(_TSAN)),
        scope = [package + ":" + t for t in targets] + _TSAN,
    )
    native.sh_test(
        name = name,
        size = "small",
        srcs = ["layering_test.sh"],
        args = [package, "$(rootpath :%s_deps)" % name] + forbidden,
        data = [":%s_deps" % name],
    )
