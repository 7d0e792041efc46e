// Writes operator/prometheusrule.yaml from syncnorm-alerts.yaml: the plain
// rule file's `groups:` (comments and all) as the PrometheusRule's spec.
// deploy:monitoring_test fails while the two differ; run this, from the
// repository root, after editing the rules:
//   node deploy/monitoring/make_prometheusrule.js
'use strict';

const fs = require('node:fs');
const path = require('node:path');

const HEADER = `# GENERATED from ../syncnorm-alerts.yaml by
# deploy/monitoring/make_prometheusrule.js: edit that file, then run
#   node deploy/monitoring/make_prometheusrule.js
# syncnorm's alerting rules for the Prometheus Operator (see
# kustomization.yaml); deploy:monitoring_test checks that the groups equal
# the plain file's.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: syncnorm-aggregator
  labels:
    app.kubernetes.io/name: syncnorm-aggregator
    app.kubernetes.io/part-of: syncnorm
spec:
`;

// The PrometheusRule that holds the rule file's text `rules`.
function prometheusRule(rules) {
  const start = rules.search(/^groups:/m);
  if (start < 0) throw new Error('no top-level "groups:" in the rule file');
  const indented = rules.slice(start).split('\n')
      .map((line) => (line === '' ? line : `  ${line}`));
  return HEADER + indented.join('\n');
}

if (require.main === module) {
  const dir = path.dirname(__filename);
  const rules = fs.readFileSync(path.join(dir, 'syncnorm-alerts.yaml'), 'utf8');
  fs.writeFileSync(path.join(dir, 'operator', 'prometheusrule.yaml'),
      prometheusRule(rules));
}

module.exports = {prometheusRule};
