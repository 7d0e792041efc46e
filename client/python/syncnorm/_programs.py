"""The programs that ship inside the installed package (syncnorm/_bin/):
syncnorm-aggregator and syncnormctl, built with the wheel."""

import os
import sys

_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin")


def path(name):
    """Where the package keeps program `name` (it may be missing: a source
    tree has none)."""
    return os.path.join(_BIN, name)


def run(name):
    """Replaces this process with program `name` and this process's
    arguments (so signals and the exit status are the program's own)."""
    program = path(name)
    if not os.access(program, os.X_OK):
        sys.exit("%s: not in this syncnorm package (%s); install the wheel "
                 "(pip install client/python), or in a source tree run "
                 "`bazel build //server:syncnorm-aggregator "
                 "//client/ctl:syncnormctl`" % (name, program))
    os.execv(program, [name] + sys.argv[1:])
