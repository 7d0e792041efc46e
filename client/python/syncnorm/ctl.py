"""syncnormctl, the admin CLI, as it ships with the package.

    syncnormctl --server=127.0.0.1:50051 jobs
    python -m syncnorm.ctl --server=127.0.0.1:50051 jobs

run the same binary (docs/cli.md, "syncnormctl"). ``BINARY`` is its path.
"""

from . import _programs

BINARY = _programs.path("syncnormctl")


def main():
    _programs.run("syncnormctl")


if __name__ == "__main__":
    main()
