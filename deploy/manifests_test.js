// Every manifest under deploy/ is a valid Kubernetes object
// (kubernetes-models; the Prometheus Operator's kinds against the fields of
// their CRDs), has no field the API does not know (validate() alone lets
// those through, and the API server would drop or refuse them), and the
// rendered kustomizations (the base and each overlay) hold together: names,
// selectors, ports, probes, volumes, the shutdown budget, the
// ServiceMonitor, and the container recipe. Run by //deploy:manifests_test from the workspace's runfiles.
'use strict';

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const test = require('node:test');
const YAML = require('yaml');

const {render, renderWithJs, renderWithKubectl, kubectlKustomize, renderer,
  readYamlDocuments} = require('./tools/kustomize.js');
const {aggregatorContainer, aggregatorStatefulSet} = require('./tools/pod.js');

const KUSTOMIZATIONS = ['deploy/base', ...fs.readdirSync('deploy/overlays')
    .map((o) => `deploy/overlays/${o}`)];
const SCHEMAS = path.join(
    path.dirname(require.resolve('kubernetes-models/package.json')),
    '_schemas');

// ---- schema validation and the unknown-field walk -------------------------

// The kubernetes-models class of an object, e.g. apps/v1 StatefulSet.
function modelOf({apiVersion, kind}) {
  const module = apiVersion.includes('/') ?
    `kubernetes-models/${apiVersion}/${kind}` :
    `kubernetes-models/v1/${kind}`;
  return require(module)[kind];
}

// The JSON-schema validator behind that class (same schema, called on our
// object so that we can watch what it reads).
function validatorOf({apiVersion, kind}) {
  const [group, version] = apiVersion.includes('/') ?
    apiVersion.split('/') : ['core', apiVersion];
  const cap = (s) => s.split('.')[0].replace(/^./, (c) => c.toUpperCase());
  return require(path.join(SCHEMAS,
      `IoK8sApi${cap(group)}${cap(version)}${kind}.js`)).validate;
}

// Fields of `object` that its schema does not define. The schema's compiled
// validator reads every property it knows on every object it visits; a
// proxy records those reads, and any own key never read is unknown. Objects
// the validator enumerates (maps such as labels, data, resources.limits)
// accept any key.
function unknownFields(object) {
  const nodes = [];
  const wrap = (value, where) => {
    if (value === null || typeof value !== 'object') return value;
    const node = {value, where, read: new Set(), isMap: false};
    nodes.push(node);
    const children = new Map();
    return new Proxy(value, {
      get(target, key) {
        const v = target[key];
        if (typeof key !== 'string') return v;
        node.read.add(key);
        if (v === null || typeof v !== 'object') return v;
        if (!children.has(key)) children.set(key, wrap(v, `${where}/${key}`));
        return children.get(key);
      },
      ownKeys(target) {
        node.isMap = true;
        return Reflect.ownKeys(target);
      },
    });
  };
  validatorOf(object)(wrap(object, ''));
  return nodes.filter((n) => !Array.isArray(n.value) && !n.isMap)
      .flatMap((n) => Object.keys(n.value).filter((k) => !n.read.has(k))
          .map((k) => `${n.where}/${k}`));
}

// ---- the Prometheus Operator's kinds ---------------------------------------

// kubernetes-models has no models of custom resources, so those of the
// Prometheus Operator (monitoring.coreos.com/v1) that deploy/monitoring
// uses are checked against these shapes: the fields of the operator's CRDs
// (v0.60 and later) that syncnorm's manifests may set, each with its type.
// A field not listed is an error, as an unknown field of a built-in kind
// is. 'duration' is the operator's Duration pattern (e.g. 15s, 1m30s).
const LABEL_SELECTOR = {matchLabels: 'map', matchExpressions: [{
  key: 'string', operator: 'string', values: ['string']}]};
const OBJECT_META = {name: 'string', namespace: 'string', labels: 'map',
  annotations: 'map'};
const CUSTOM_KINDS = {
  'monitoring.coreos.com/v1 ServiceMonitor': {
    required: ['spec.selector', 'spec.endpoints'],
    shape: {apiVersion: 'string', kind: 'string', metadata: OBJECT_META,
      spec: {jobLabel: 'string', targetLabels: ['string'],
        podTargetLabels: ['string'], selector: LABEL_SELECTOR,
        namespaceSelector: {any: 'boolean', matchNames: ['string']},
        endpoints: [{port: 'string', path: 'string', scheme: 'string',
          interval: 'duration', scrapeTimeout: 'duration',
          honorLabels: 'boolean'}]}},
  },
  'monitoring.coreos.com/v1 PrometheusRule': {
    required: ['spec.groups'],
    shape: {apiVersion: 'string', kind: 'string', metadata: OBJECT_META,
      spec: {groups: [{name: 'string', interval: 'duration',
        rules: [{alert: 'string', record: 'string', expr: 'string',
          for: 'duration', labels: 'map', annotations: 'map'}]}]}},
  },
};

// Where `value` departs from `shape`: unknown fields and wrong types.
function shapeErrors(value, shape, where) {
  if (Array.isArray(shape)) {
    if (!Array.isArray(value)) return [`${where}: not a list`];
    return value.flatMap((v, i) => shapeErrors(v, shape[0], `${where}/${i}`));
  }
  if (shape === 'map') {
    const ok = value !== null && typeof value === 'object' &&
        !Array.isArray(value) &&
        Object.values(value).every((v) => typeof v === 'string');
    return ok ? [] : [`${where}: not a map of strings`];
  }
  if (shape === 'duration') {
    return /^(0|([0-9]+(ms|s|m|h|d|w|y))+)$/.test(value) ? [] :
      [`${where}: '${value}' is not a duration`];
  }
  if (typeof shape === 'string') {
    return typeof value === shape ? [] : [`${where}: not a ${shape}`];
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return [`${where}: not an object`];
  }
  return Object.entries(value).flatMap(([k, v]) => (k in shape ?
    shapeErrors(v, shape[k], `${where}/${k}`) :
    [`${where}/${k}: a field the CRD lacks`]));
}

function assertValidCustomObject(object, where) {
  const kind = CUSTOM_KINDS[`${object.apiVersion} ${object.kind}`];
  assert.ok(kind, `${where}: ${idOf(object)}: no shape for ` +
            `${object.apiVersion} ${object.kind} in manifests_test.js`);
  assert.deepEqual(shapeErrors(object, kind.shape, ''), [],
                   `${where}: ${idOf(object)}`);
  for (const field of ['metadata.name', ...kind.required]) {
    assert.notEqual(field.split('.').reduce((o, k) => o?.[k], object),
                    undefined, `${where}: ${idOf(object)} lacks ${field}`);
  }
  for (const rule of (object.spec.groups ?? []).flatMap((g) => g.rules)) {
    assert.equal(('alert' in rule) + ('record' in rule), 1,
                 `${where}: a rule is an alert or a record`);
    assert.ok(rule.expr, `${where}: a rule without expr`);
  }
}

function assertValidObject(object, where) {
  if (object.apiVersion.startsWith('monitoring.coreos.com/')) {
    assertValidCustomObject(object, where);
    return;
  }
  const model = new (modelOf(object))(object);
  assert.doesNotThrow(() => model.validate(), `${where}: ${idOf(object)}`);
  assert.deepEqual(unknownFields(object), [],
                   `${where}: ${idOf(object)} has fields the API lacks`);
}

function idOf(o) {
  return `${o.kind}/${o.metadata?.name}`;
}

// ---- the files -------------------------------------------------------------

// YAML files under deploy/ that are not Kubernetes objects: Prometheus's
// own formats (a rule file and promtool's tests of it).
const NOT_KUBERNETES = new Set([
  'deploy/monitoring/syncnorm-alerts.yaml',
  'deploy/monitoring/syncnorm-alerts_test.yaml',
]);

function manifestFiles(dir) {
  return fs.readdirSync(dir, {withFileTypes: true}).flatMap((e) => {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) return manifestFiles(p);
    return /\.ya?ml$/.test(e.name) && e.name !== 'kustomization.yaml' &&
        !NOT_KUBERNETES.has(p) ? [p] : [];
  });
}

function patchFiles() {
  return KUSTOMIZATIONS.flatMap((k) => {
    const [kustomization] = readYamlDocuments(`${k}/kustomization.yaml`);
    return (kustomization.patches ?? []).map((p) => path.join(k, p.path));
  });
}

test('every manifest file is a valid object with known fields only', () => {
  const patches = new Set(patchFiles());
  const files = manifestFiles('deploy').filter((f) => !patches.has(f));
  assert.ok(files.length >= 5, files.join(' '));
  for (const file of files) {
    for (const object of readYamlDocuments(file)) {
      assertValidObject(object, file);
    }
  }
});

test('patches name only fields the API knows', () => {
  for (const file of patchFiles()) {
    for (const patch of readYamlDocuments(file)) {
      // A patch is a partial object: required fields may be missing, so
      // only the walk applies; the rendered result is validated below.
      assert.deepEqual(unknownFields(patch), [], file);
    }
  }
});

test('the CRD shapes catch unknown fields and wrong types', () => {
  const [monitor] = readYamlDocuments(
      'deploy/monitoring/operator/servicemonitor.yaml');
  assert.doesNotThrow(() => assertValidObject(monitor, 'servicemonitor'));
  const spoiled = structuredClone(monitor);
  spoiled.spec.endpoints[0].intervall = '15s';
  spoiled.spec.endpoints[0].interval = 15;
  spoiled.spec.selectr = {};
  assert.deepEqual(shapeErrors(spoiled,
      CUSTOM_KINDS['monitoring.coreos.com/v1 ServiceMonitor'].shape, '')
      .sort(), [
    '/spec/endpoints/0/interval: \'15\' is not a duration',
    '/spec/endpoints/0/intervall: a field the CRD lacks',
    '/spec/selectr: a field the CRD lacks',
  ]);
});

test('the unknown-field walk catches what validate() lets through', () => {
  const [statefulSet] = readYamlDocuments('deploy/base/statefulset.yaml');
  const spoiled = structuredClone(statefulSet);
  spoiled.spec.template.spec.containers[0].livenessProbe.grpc.prot = 1;
  spoiled.spec.podManagmentPolicy = 'Parallel';
  const model = new (modelOf(spoiled))(spoiled);
  assert.doesNotThrow(() => model.validate());
  assert.deepEqual(unknownFields(spoiled).sort(), [
    '/spec/podManagmentPolicy',
    '/spec/template/spec/containers/0/livenessProbe/grpc/prot',
  ]);
});

for (const k of KUSTOMIZATIONS) {
  test(`${k} renders (${renderer()}) to valid objects that hold together`,
      () => {
    const objects = render(k);
    for (const object of objects) assertValidObject(object, k);
    checkCoherent(objects, k);
  });
}

// ---- what the rendered objects must agree on ------------------------------

function labelsMatch(selector, labels) {
  return Object.entries(selector.matchLabels ?? {})
      .every(([key, value]) => labels[key] === value);
}

function flagValue(args, name) {
  const values = args.filter((a) => a.startsWith(`--${name}=`))
      .map((a) => a.slice(name.length + 3));
  assert.equal(values.length, 1, `--${name} once in ${args.join(' ')}`);
  return values[0];
}

// A quantity ("500m", "2", "512Mi", "2Gi") in base units.
function quantity(text) {
  const m = String(text).match(/^([0-9.]+)(m|Ki|Mi|Gi|Ti)?$/);
  assert.ok(m, `quantity ${text}`);
  const unit = {m: 1e-3, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40};
  return Number(m[1]) * (unit[m[2]] ?? 1);
}

function checkCoherent(objects, where) {
  const statefulSet = aggregatorStatefulSet(objects);
  const spec = statefulSet.spec;
  const pod = spec.template.spec;
  const podLabels = spec.template.metadata.labels;
  const container = aggregatorContainer(statefulSet);
  const ofKind = (kind) => objects.filter((o) => o.kind === kind);

  assert.equal(spec.podManagementPolicy, 'Parallel', where);
  assert.ok(labelsMatch(spec.selector, podLabels), `${where}: selector`);
  const [service] = ofKind('Service');
  assert.equal(service.metadata.name, spec.serviceName, where);
  assert.equal(service.spec.clusterIP, 'None', `${where}: headless`);
  assert.ok(labelsMatch({matchLabels: service.spec.selector}, podLabels));
  const [pdb] = ofKind('PodDisruptionBudget');
  assert.ok(labelsMatch(pdb.spec.selector, podLabels), `${where}: PDB`);
  assert.ok(pdb.spec.maxUnavailable >= 1, `${where}: PDB lets drains go on`);

  // The gRPC port: --listen, containerPort, probes, Service, image all
  // agree; and the metrics port: --metrics_listen, containerPort, Service,
  // the scrape annotations.
  const listen = flagValue(container.args, 'listen');
  assert.match(listen, /^0\.0\.0\.0:\d+$/, `${where}: listen on the pod IP`);
  const port = Number(listen.split(':')[1]);
  const metricsListen = flagValue(container.args, 'metrics_listen');
  assert.match(metricsListen, /^0\.0\.0\.0:\d+$/, `${where}: metrics`);
  const metricsPort = Number(metricsListen.split(':')[1]);
  assert.notEqual(metricsPort, port, `${where}: two ports`);
  assert.deepEqual(container.ports.map((p) => [p.name, p.containerPort]),
                   [['grpc', port], ['metrics', metricsPort]], where);
  const annotations = spec.template.metadata.annotations ?? {};
  assert.equal(annotations['prometheus.io/scrape'], 'true', where);
  assert.equal(annotations['prometheus.io/port'], String(metricsPort), where);
  assert.equal(annotations['prometheus.io/path'], '/metrics', where);
  for (const probe of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
    assert.equal(typeof container[probe].grpc.port, 'number',
                 `${where}: ${probe} is a native gRPC probe, numeric port`);
    assert.equal(container[probe].grpc.port, port, `${where}: ${probe}`);
  }
  const servicePort = service.spec.ports[0];
  assert.ok(servicePort.targetPort === port ||
            servicePort.targetPort === container.ports[0].name);
  const serviceMetrics = service.spec.ports.find((p) => p.name === 'metrics');
  assert.ok(serviceMetrics && (serviceMetrics.targetPort === metricsPort ||
                               serviceMetrics.targetPort === 'metrics'),
            `${where}: the Service exposes the metrics port`);

  // Resources: requests and limits, requests within limits.
  for (const r of ['cpu', 'memory']) {
    const {requests, limits} = container.resources;
    assert.ok(quantity(requests[r]) <= quantity(limits[r]), `${where}: ${r}`);
  }

  // Volumes: every mount has a source; the data dir is on the claim; the
  // flag file is a key of the ConfigMap; the secret exists.
  const mountOf = (name) => container.volumeMounts.find((m) => m.name === name);
  for (const m of container.volumeMounts) {
    const volume = (pod.volumes ?? []).find((v) => v.name === m.name);
    const claim = spec.volumeClaimTemplates.find(
        (c) => c.metadata.name === m.name);
    assert.ok(volume || claim, `${where}: mount ${m.name}`);
    if (volume?.configMap) {
      assert.ok(objects.some((o) => o.kind === 'ConfigMap' &&
                             o.metadata.name === volume.configMap.name));
    }
    if (volume?.secret) {
      // The operator's own Secret (not rendered here) must be optional, or
      // the pods would not start without it.
      assert.ok(volume.secret.optional === true ||
                objects.some((o) => o.kind === 'Secret' &&
                             o.metadata.name === volume.secret.secretName),
                `${where}: secret ${volume.secret.secretName}`);
    }
  }
  const dataDir = flagValue(container.args, 'data_dir');
  assert.ok(dataDir.startsWith(mountOf('data').mountPath + '/'),
            `${where}: --data_dir on the volume claim`);
  // Backups on a volume of their own: a lost data volume leaves them.
  const backupDir = flagValue(container.args, 'backup_dir');
  const backupMount = container.volumeMounts.find(
      (m) => backupDir.startsWith(m.mountPath + '/'));
  assert.ok(backupMount, `${where}: --backup_dir on a mounted volume`);
  assert.notEqual(backupMount.name, 'data', `${where}: backups off data`);
  assert.ok(spec.volumeClaimTemplates.some(
      (c) => c.metadata.name === backupMount.name),
  `${where}: --backup_dir on a volume claim`);
  const flagfile = flagValue(container.args, 'flagfile');
  const configMount = mountOf('config');
  assert.equal(path.dirname(flagfile), configMount.mountPath);
  const configVolume = pod.volumes.find((v) => v.name === 'config');
  const configMap = objects.find((o) => o.kind === 'ConfigMap' &&
      o.metadata.name === configVolume.configMap.name);
  const flags = configMap.data[path.basename(flagfile)];
  assert.ok(flags, `${where}: the ConfigMap holds ${flagfile}`);

  // The args hold only what the pod spec fixes; the rest is in the file.
  assert.deepEqual(container.args.map((a) => a.split('=')[0]).sort(),
                   ['--backup_dir', '--data_dir', '--flagfile', '--listen',
                     '--metrics_listen'],
                   where);
  for (const line of flags.split('\n')) {
    assert.doesNotMatch(line,
        /^\s*--(listen|data_dir|backup_dir|port_file|flagfile|metrics_listen)=/,
                        `${where}: pod-specific flag in the flag file`);
  }
  checkNetworkPolicy(objects, where, flags, podLabels);
  checkServiceMonitors(objects, where, service);

  // Shutdown: preStop, then the server's grace (see statefulset_args_test
  // for the value the binary reports), inside terminationGracePeriodSeconds.
  const preStop = container.lifecycle.preStop.exec.command;
  assert.equal(preStop[0], '/bin/sleep');
  assert.ok(pod.terminationGracePeriodSeconds >= Number(preStop[1]) + 15,
            `${where}: grace period leaves room after preStop`);

  // Non-root, as the image's USER.
  assert.equal(pod.securityContext.runAsNonRoot, true);
  assert.equal(container.securityContext.allowPrivilegeEscalation, false);
  assert.equal(container.securityContext.readOnlyRootFilesystem, true);
}

// A ServiceMonitor, where an overlay has one (deploy/monitoring/operator),
// scrapes the Service's metrics port: it selects the Service by its labels,
// in its namespace, names the port the Service calls `metrics`, and takes
// its job label from a label the Service has.
function checkServiceMonitors(objects, where, service) {
  for (const monitor of objects.filter((o) => o.kind === 'ServiceMonitor')) {
    const id = `${where}: ${idOf(monitor)}`;
    assert.equal(monitor.metadata.namespace, service.metadata.namespace, id);
    assert.ok(labelsMatch(monitor.spec.selector, service.metadata.labels),
              `${id} selects the Service`);
    assert.equal(monitor.spec.selector.matchExpressions, undefined, id);
    assert.deepEqual(monitor.spec.endpoints.map((e) => e.port), ['metrics'],
                     id);
    if (monitor.spec.jobLabel) {
      assert.ok(service.metadata.labels[monitor.spec.jobLabel],
                `${id}: jobLabel is a label of the Service`);
    }
  }
}

// A plaintext deployment (--allow_insecure) admits only the trainers (label
// syncnorm.io/client=true) on the gRPC port and Prometheus on the metrics
// port: one NetworkPolicy selects the shards, for Ingress, with exactly
// those two rules, neither of which admits every pod.
function checkNetworkPolicy(objects, where, flags, podLabels) {
  const insecure = flags.split('\n')
      .some((l) => /^\s*--allow_insecure(=true)?\s*$/.test(l));
  const policies = objects.filter((o) => o.kind === 'NetworkPolicy' &&
      labelsMatch(o.spec.podSelector, podLabels));
  if (!insecure && policies.length === 0) return;
  assert.equal(policies.length, 1, `${where}: one NetworkPolicy for the shards`);
  const [policy] = policies;
  assert.ok(policy.spec.policyTypes.includes('Ingress'), where);
  const admitted = {};
  for (const rule of policy.spec.ingress) {
    assert.ok(rule.from?.length > 0, `${where}: a rule admits every source`);
    for (const peer of rule.from) {
      assert.ok(Object.keys(peer.podSelector?.matchLabels ?? {}).length > 0,
                `${where}: a peer without a pod selector admits every pod`);
      assert.equal(peer.ipBlock, undefined, `${where}: no IP blocks`);
    }
    assert.ok(rule.ports?.length > 0, `${where}: a rule for every port`);
    for (const port of rule.ports) {
      admitted[port.port] = rule.from.map((p) => p.podSelector.matchLabels);
    }
  }
  assert.deepEqual(admitted, {
    grpc: [{'syncnorm.io/client': 'true'}],
    metrics: [{'app.kubernetes.io/name': 'prometheus'}],
  }, where);
}

test('the base ships no Secret: applying it keeps one managed elsewhere', () => {
  for (const k of KUSTOMIZATIONS) {
    assert.deepEqual(render(k).filter((o) => o.kind === 'Secret'), [], k);
  }
});

// ---- the container recipe --------------------------------------------------

test('the container recipe matches the manifests', () => {
  const dockerfile = fs.readFileSync('deploy/Dockerfile', 'utf8')
      .replace(/\\\n/g, ' ');
  const lines = dockerfile.split('\n').filter((l) => !/^\s*(#|$)/.test(l));
  const froms = lines.filter((l) => l.startsWith('FROM '));
  assert.deepEqual(froms, ['FROM debian:bookworm AS build',
    'FROM debian:bookworm-slim']);
  // The build stage runs only scripts that the test suite runs too:
  // scripts/deps.sh (the README's test command) and scripts/build-release.sh
  // (deploy:release_test).
  const buildStage = lines.slice(0, lines.indexOf(froms[1]));
  const scripts = buildStage.filter((l) => l.startsWith('RUN '))
      .flatMap((l) => l.slice(4).split('&&').map((c) => c.trim()));
  assert.deepEqual(scripts, ['bash scripts/deps.sh --build-only',
    'bash scripts/build-release.sh /out']);

  const statefulSet = aggregatorStatefulSet(render('deploy/base'));
  const pod = statefulSet.spec.template.spec;
  const container = aggregatorContainer(statefulSet);
  const user = lines.find((l) => l.startsWith('USER ')).slice(5);
  assert.equal(user, `${pod.securityContext.runAsUser}:` +
                     `${pod.securityContext.runAsGroup}`);
  assert.notEqual(pod.securityContext.runAsUser, 0);
  const expose = lines.find((l) => l.startsWith('EXPOSE ')).slice(7);
  assert.equal(Number(expose), container.ports[0].containerPort);
  const entrypoint = JSON.parse(
      lines.find((l) => l.startsWith('ENTRYPOINT ')).slice(11));
  assert.deepEqual(entrypoint, ['/usr/local/bin/syncnorm-aggregator']);
  assert.equal(container.command, undefined, 'the image\'s ENTRYPOINT runs');
  assert.match(dockerfile, /runtime-packages\.txt/);
});

// ---- the renderer against real kustomize, where kubectl is installed -------

test('kubectl kustomize renders what the fallback renderer renders', (t) => {
  if (!kubectlKustomize()) {
    t.skip('no kubectl with kustomize v4+ here; deploy/tools/kustomize.js ' +
           'alone renders');
    return;
  }
  // Generated names carry a content hash in kustomize's output only.
  const byId = (objects) => Object.fromEntries(JSON.parse(
      JSON.stringify(objects).replace(/(-flags|-secrets)-[a-z0-9]{10}"/g,
          '$1"')).map((o) => [idOf(o), o]));
  for (const k of KUSTOMIZATIONS) {
    assert.deepEqual(byId(renderWithJs(k)), byId(renderWithKubectl(k)), k);
  }
});
