"""The aggregator that ships with the package.

    syncnorm-aggregator --listen=127.0.0.1:50051 --data_dir=./syncnorm-data
    python -m syncnorm.aggregator --help

run the same binary (docs/operations.md, "The aggregator"). ``BINARY`` is its path,
for launchers that start it themselves.
"""

from . import _programs

BINARY = _programs.path("syncnorm-aggregator")


def main():
    _programs.run("syncnorm-aggregator")


if __name__ == "__main__":
    main()
