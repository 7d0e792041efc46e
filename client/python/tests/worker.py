"""One rank of the torch comparison: runs the named cases through syncnorm
and saves its records to <out>/rank<r>.pt."""

import argparse
import os
import sys
import traceback

import torch

import cases
import syncnorm


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--run_id", required=True)
    parser.add_argument("--cases", required=True, help="comma-separated")
    parser.add_argument("--world_size", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    client = syncnorm.Client(args.address, round_timeout=60.0)
    results = {}
    for name in args.cases.split(","):
        try:
            results[name] = cases.worker_run(
                cases.BY_NAME[name], args.rank, args.world_size, client,
                "%s-%s" % (args.run_id, name))
        except Exception:  # report which case, then fail the worker
            print("case %s failed on rank %d:" % (name, args.rank))
            traceback.print_exc()
            sys.stdout.flush()
            os._exit(1)
    torch.save(results, os.path.join(args.out, "rank%d.pt" % args.rank))


if __name__ == "__main__":
    main()
