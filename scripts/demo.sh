#!/usr/bin/env bash
# The main job: builds syncnorm and runs the demo (an aggregator and W worker
# processes training a stack of BN layers, checked against float64). Extra
# arguments go to the demo, e.g. --workers=8 --steps=50.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
exec bazel run //tests:syncnorm-demo -- "$@"
