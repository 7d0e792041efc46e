"""CRC32C (issue 18): the checksum of every round log record and of every
RocksDB write, in GB/s, against one register stepping through the same
bytes with the same SSE4.2 instruction, measured by the same process in the
same run (bench/crc32c_bench.cc)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def main():
    out, reps = common.run_micro("bench/bench-crc32c")
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == "SKIP":
            print("bench: " + line)
            return
        if not parts or parts[0] != "CRC":
            continue
        n, ours, one = int(parts[1]), float(parts[2]), float(parts[3])
        rows.append([n, "%.2f" % (n / ours), "%.2f" % (n / one)])
        common.ratio("crc32c_gbps[%d bytes]" % n, n / ours,
                     "one_lane_gbps", n / one, "GB/s",
                     higher_is_better=True)
    print("\n### CRC32C, GB/s (best of %d passes)\n" % reps)
    common.table(["bytes", "Crc32c (three lanes)", "one lane"], rows)


if __name__ == "__main__":
    main()
    common.require_ratios()
