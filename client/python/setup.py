"""pip install for syncnorm: builds the extension with Bazel, offline.

    /usr/bin/python3 -m pip install --no-build-isolation --no-deps \
        --break-system-packages ./client/python

The build step runs `bazel build //client/python:_syncnorm.so` in the
checkout this file sits in and puts the .so into the package. Set
SYNCNORM_EXTENSION=/path/to/_syncnorm.so to use a prebuilt one instead.
Needs Debian's python3, pybind11-dev, python3-numpy (and python3-torch for
syncnorm.torch); see scripts/deps.sh.
"""

import os
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = "//client/python:_syncnorm.so"


def workspace():
    root = os.path.abspath(os.path.join(HERE, "..", ".."))
    if not os.path.exists(os.path.join(root, "WORKSPACE")):
        raise RuntimeError(
            "setup.py must run from client/python of a syncnorm checkout "
            "(no WORKSPACE at %s); pip builds in place with "
            "--no-build-isolation, or set SYNCNORM_EXTENSION" % root)
    return root


def build_extension():
    """The path of a built _syncnorm.so."""
    prebuilt = os.environ.get("SYNCNORM_EXTENSION")
    if prebuilt:
        return prebuilt
    root = workspace()
    subprocess.check_call(["bazel", "build", TARGET], cwd=root)
    bin_dir = subprocess.check_output(["bazel", "info", "bazel-bin"],
                                      cwd=root, text=True).strip()
    return os.path.join(bin_dir, "client", "python", "syncnorm",
                        "_syncnorm.so")


class BuildPyWithExtension(build_py):
    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "syncnorm", "_syncnorm.so")
        self.copy_file(build_extension(), target, preserve_mode=False)
        os.chmod(target, 0o755)


class BinaryDistribution(Distribution):
    """A platform wheel: the package carries a compiled extension."""

    def has_ext_modules(self):
        return True


setup(
    name="syncnorm",
    version="0.1.0",
    description="Synchronized batch normalization as a service: the client "
                "and a drop-in torch SyncBatchNorm",
    packages=["syncnorm", "syncnorm.torch"],
    python_requires=">=3.9",
    cmdclass={"build_py": BuildPyWithExtension},
    distclass=BinaryDistribution,
    zip_safe=False,
)
