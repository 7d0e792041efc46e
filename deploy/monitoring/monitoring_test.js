// deploy:monitoring_test: what Grafana and Prometheus need of
// deploy/monitoring, checked without either (tests:monitoring_test runs
// every expression through a real Prometheus against a real aggregator):
//   - the dashboard has the structure Grafana loads: a schemaVersion,
//     panels each with an id (unique), type, title and gridPos on the
//     24-column grid without overlaps, the `datasource` variable of type
//     prometheus that every panel and target uses, a row per concern, and
//     every variable an expression names defined;
//   - every alert has a severity, a summary, a description and a
//     runbook_url naming its entry under "Runbook" in docs/operations.md;
//   - the PrometheusRule holds the plain rule file's groups, as
//     make_prometheusrule.js writes them;
//   - the job the rules and the dashboard select is the job the
//     ServiceMonitor gives, and the example overlay includes the component.
// Run from the workspace's runfiles by //deploy:monitoring_test; reads
// docs/operations.md in the checkout (tools/node/node_test.sh exports
// SYNCNORM_CHECKOUT), so the test runs every time ("external").
'use strict';

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const test = require('node:test');

const {render, readYamlDocuments} = require('../tools/kustomize.js');
const {prometheusRule} = require('./make_prometheusrule.js');

const DIR = 'deploy/monitoring';
const DASHBOARD = JSON.parse(
    fs.readFileSync(`${DIR}/syncnorm-dashboard.json`, 'utf8'));
const RULES_TEXT = fs.readFileSync(`${DIR}/syncnorm-alerts.yaml`, 'utf8');
const [RULES] = readYamlDocuments(`${DIR}/syncnorm-alerts.yaml`);
const ALERTS = RULES.groups.flatMap((g) => g.rules).filter((r) => r.alert);

// The concerns an operator looks at, one dashboard row each, in order.
const ROWS = [
  'Traffic and round latency',
  'Deadlines and stragglers by cause',
  'Membership and staleness',
  'Statistics health',
  'Memory against its bound',
  'Round log and RocksDB',
  'Connections closed by reason',
];

// Alerts that must exist, one per condition operators are paged or warned
// for.
const REQUIRED_ALERTS = [
  'SyncnormRankFlagged', 'SyncnormDeadlineFailures', 'SyncnormMemoryNearLimit',
  'SyncnormRoundLogSpilling', 'SyncnormShardDown', 'SyncnormShardAbsent',
];

// Grafana's own variables, which it replaces in every query.
const GRAFANA_VARIABLES = new Set(['__rate_interval', '__interval',
  '__interval_ms', '__range', '__range_s', '__range_ms']);

function panelsOf(dashboard) {
  return dashboard.panels.flatMap((p) => [p, ...(p.panels ?? [])]);
}

function expressions(dashboard) {
  return panelsOf(dashboard).flatMap((p) => (p.targets ?? [])
      .map((t) => ({panel: p.title, expr: t.expr})));
}

// ---- the dashboard ----------------------------------------------------------

test('the dashboard has the structure Grafana loads', () => {
  assert.ok(Number.isInteger(DASHBOARD.schemaVersion) &&
            DASHBOARD.schemaVersion >= 36, 'schemaVersion of Grafana 9+');
  assert.equal(typeof DASHBOARD.uid, 'string');
  assert.ok(DASHBOARD.title);
  assert.ok(Array.isArray(DASHBOARD.panels) && DASHBOARD.panels.length > 0);
  const ids = panelsOf(DASHBOARD).map((p) => p.id);
  assert.ok(ids.every(Number.isInteger), 'integer panel ids');
  assert.equal(new Set(ids).size, ids.length, 'unique panel ids');
  for (const p of panelsOf(DASHBOARD)) {
    assert.equal(typeof p.type, 'string', `panel ${p.id}: type`);
    assert.ok(p.title, `panel ${p.id}: title`);
    const {h, w, x, y} = p.gridPos ?? {};
    assert.ok([h, w, x, y].every((v) => Number.isInteger(v) && v >= 0) &&
              w >= 1 && h >= 1 && x + w <= 24, `${p.title}: gridPos`);
    if (p.type === 'row') {
      // An expanded row keeps its panels at the top level, after it.
      assert.equal(p.collapsed, false, `${p.title}: expanded`);
      assert.deepEqual(p.panels, [], `${p.title}: its panels follow it`);
      continue;
    }
    assert.deepEqual(p.datasource, {type: 'prometheus', uid: '${datasource}'},
                     `${p.title}: the datasource variable`);
    assert.ok(p.targets?.length > 0, `${p.title}: targets`);
    const refIds = p.targets.map((t) => t.refId);
    assert.equal(new Set(refIds).size, refIds.length, `${p.title}: refIds`);
    for (const t of p.targets) {
      assert.deepEqual(t.datasource, p.datasource, `${p.title}: target`);
      assert.ok(typeof t.expr === 'string' && t.expr.trim(),
                `${p.title}: expr`);
    }
  }
});

test('no two panels overlap', () => {
  const panels = DASHBOARD.panels;
  for (let i = 0; i < panels.length; i++) {
    for (let j = i + 1; j < panels.length; j++) {
      const a = panels[i].gridPos;
      const b = panels[j].gridPos;
      const apart = a.x + a.w <= b.x || b.x + b.w <= a.x ||
          a.y + a.h <= b.y || b.y + b.h <= a.y;
      assert.ok(apart, `${panels[i].title} overlaps ${panels[j].title}`);
    }
  }
});

test('a row per concern, in order, each with its panels below it', () => {
  const rows = DASHBOARD.panels.filter((p) => p.type === 'row');
  assert.deepEqual(rows.map((r) => r.title), ROWS);
  let row = null;
  const count = new Map();
  for (const p of [...DASHBOARD.panels].sort(
      (a, b) => a.gridPos.y - b.gridPos.y || a.gridPos.x - b.gridPos.x)) {
    if (p.type === 'row') {
      row = p;
      continue;
    }
    assert.ok(row, `${p.title} is above the first row`);
    count.set(row.title, (count.get(row.title) ?? 0) + 1);
  }
  for (const title of ROWS) assert.ok(count.get(title) > 0, title);
});

test('the datasource variable, and every variable used is defined', () => {
  const variables = DASHBOARD.templating.list;
  const datasource = variables.find((v) => v.name === 'datasource');
  assert.equal(datasource?.type, 'datasource');
  assert.equal(datasource.query, 'prometheus');
  const defined = new Set(variables.map((v) => v.name));
  for (const v of variables.filter((v) => v.type === 'query')) {
    assert.deepEqual(v.datasource, {type: 'prometheus', uid: '${datasource}'},
                     v.name);
  }
  const used = [...expressions(DASHBOARD).map((e) => e.expr),
    ...variables.map((v) => v.query?.query ?? '')].join('\n');
  for (const [, a, b] of used.matchAll(/\$(?:\{(\w+)\}|(\w+))/g)) {
    const name = a ?? b;
    assert.ok(defined.has(name) || GRAFANA_VARIABLES.has(name),
              `variable $${name} is not defined`);
  }
});

test('every series of the aggregator is filtered by the variables', () => {
  const selector = /\b(syncnorm_\w+|grpc_server_\w+|process_\w+|up)\{([^}]*)\}/g;
  for (const {panel, expr} of expressions(DASHBOARD)) {
    assert.doesNotMatch(expr, /\b(syncnorm_\w+|grpc_server_\w+|process_\w+)\b(?!\{)/,
                        `${panel}: a selector without labels`);
    for (const [, name, labels] of expr.matchAll(selector)) {
      for (const filter of ['job=~"$job"', 'namespace=~"$namespace"',
        'pod=~"$pod"']) {
        assert.ok(labels.includes(filter), `${panel}: ${name} lacks ${filter}`);
      }
    }
  }
});

// ---- the alerting rules -----------------------------------------------------

// GitHub's anchor of a heading (as docs/check_links.py makes them).
function slug(heading) {
  return heading.replace(/\[([^\]]*)\]\([^)]*\)/g, '$1').toLowerCase()
      .split('').filter((c) => /[\p{L}\p{N} _-]/u.test(c))
      .map((c) => (c === ' ' ? '-' : c)).join('');
}

// The anchors of the headings under "## Runbook" in docs/operations.md.
function runbookAnchors() {
  const checkout = process.env.SYNCNORM_CHECKOUT ?? '.';
  const text = fs.readFileSync(
      path.join(checkout, 'docs/operations.md'), 'utf8');
  const anchors = new Set();
  let inRunbook = false;
  let fenced = false;
  for (const line of text.split('\n')) {
    if (/^\s*(```|~~~)/.test(line)) fenced = !fenced;
    if (fenced) continue;
    const m = line.match(/^(#{1,6})\s+(.*?)\s*#*\s*$/);
    if (!m) continue;
    if (m[1].length <= 2) inRunbook = m[2] === 'Runbook';
    else if (inRunbook) anchors.add(slug(m[2]));
  }
  return anchors;
}

test('every alert has a severity, a summary, a description and a runbook',
    () => {
      const names = ALERTS.map((a) => a.alert);
      assert.equal(new Set(names).size, names.length, 'unique alert names');
      for (const name of REQUIRED_ALERTS) assert.ok(names.includes(name), name);
      const anchors = runbookAnchors();
      for (const a of ALERTS) {
        assert.match(a.for ?? '', /^([0-9]+(ms|s|m|h|d|w|y))+$/,
                     `${a.alert}: for`);
        assert.ok(['critical', 'warning', 'info'].includes(a.labels?.severity),
                  `${a.alert}: severity`);
        assert.ok(a.annotations?.summary, `${a.alert}: summary`);
        assert.ok(a.annotations?.description, `${a.alert}: description`);
        const url = a.annotations?.runbook_url ?? '';
        const m = url.match(/(?:^|\/)docs\/operations\.md#([\w-]+)$/);
        assert.ok(m, `${a.alert}: runbook_url ${url}`);
        assert.equal(m[1], a.alert.toLowerCase(), `${a.alert}: its own entry`);
        assert.ok(anchors.has(m[1]),
                  `${a.alert}: docs/operations.md has no Runbook entry ` +
                  `"### ${a.alert}"`);
      }
    });

test('the PrometheusRule holds the rule file\'s groups', () => {
  const file = `${DIR}/operator/prometheusrule.yaml`;
  const [rule] = readYamlDocuments(file);
  const hint = 'run node deploy/monitoring/make_prometheusrule.js';
  assert.deepEqual(rule.spec.groups, RULES.groups, `${file}: ${hint}`);
  assert.equal(fs.readFileSync(file, 'utf8'), prometheusRule(RULES_TEXT),
               `${file}: ${hint}`);
});

test('rules, dashboard and ServiceMonitor agree on the job', () => {
  const objects = render('deploy/overlays/example');
  const monitor = objects.find((o) => o.kind === 'ServiceMonitor');
  assert.ok(monitor, 'the example overlay includes deploy/monitoring/operator');
  assert.ok(objects.some((o) => o.kind === 'PrometheusRule'));
  const service = objects.find((o) => o.kind === 'Service');
  const job = monitor.spec.jobLabel ?
    service.metadata.labels[monitor.spec.jobLabel] : service.metadata.name;
  for (const a of ALERTS) {
    const jobs = [...a.expr.matchAll(/\bjob="([^"]*)"/g)].map((m) => m[1]);
    assert.ok(jobs.length > 0 || /kube_/.test(a.expr), `${a.alert}: no job`);
    for (const j of jobs) assert.equal(j, job, a.alert);
  }
  const variable = DASHBOARD.templating.list.find((v) => v.name === 'job');
  assert.equal(variable.current.value, job, 'the dashboard\'s default job');
});
