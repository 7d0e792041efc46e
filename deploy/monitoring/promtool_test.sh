#!/usr/bin/env bash
# deploy:monitoring_rules_test: Prometheus's own checks of the alerting
# rules. `promtool check rules` (the file loads: YAML, PromQL, templates)
# and `promtool test rules` (syncnorm-alerts_test.yaml: each alert fires
# after its `for:` on the series that should fire it, with its labels and
# annotations, and not on the others). Skipped, saying why, where promtool
# is not installed (scripts/deps.sh installs Debian's prometheus, which has
# it).
set -euo pipefail

if ! command -v promtool >/dev/null; then
  echo "SKIP: promtool is missing: run scripts/deps.sh" >&2
  exit 0
fi
cd deploy/monitoring
promtool check rules syncnorm-alerts.yaml
promtool test rules syncnorm-alerts_test.yaml
