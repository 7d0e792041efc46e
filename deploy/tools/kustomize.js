// The manifests as the cluster will see them: render(dir) runs `kubectl
// kustomize` where kubectl (with kustomize v4 or later) is installed, and
// otherwise (or with SYNCNORM_KUSTOMIZE=js) a small renderer of the
// kustomize features deploy/ uses, so that the test suite and
// deploy/local-cluster work on machines without kubectl (CI's). The small
// renderer rejects every kustomization field it does not implement, so an
// overlay cannot silently rely on one; where kubectl is installed,
// deploy:manifests_test checks that both render the same objects.
//
// One difference, on purpose: the small renderer's generated ConfigMaps and
// Secrets keep their plain names (kustomize appends a hash of the content
// and rewrites the references; nothing here depends on the name).
'use strict';

const childProcess = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const YAML = require('yaml');

const KNOWN_FIELDS = new Set([
  'apiVersion', 'kind', 'namespace', 'labels', 'resources', 'components',
  'images', 'replicas', 'patches', 'configMapGenerator', 'secretGenerator',
]);

// What a component (kind: Component, as deploy/monitoring/operator) may
// hold here: resources only, which it adds to its includer's.
const COMPONENT_FIELDS = new Set(['apiVersion', 'kind', 'resources']);

// Kinds that have no namespace (of those a deployment of ours may hold).
const CLUSTER_SCOPED = new Set(['Namespace', 'StorageClass',
  'PersistentVolume', 'ClusterRole', 'ClusterRoleBinding',
  'PriorityClass', 'CustomResourceDefinition']);

// Strategic-merge keys of the lists this project patches; every other list
// is replaced as a whole, as the Kubernetes API defines for it.
const MERGE_KEYS = {
  containers: 'name', initContainers: 'name', volumes: 'name', env: 'name',
  volumeMounts: 'mountPath', imagePullSecrets: 'name',
  ports: (item) => ('containerPort' in item ? 'containerPort' : 'port'),
};

function readYamlDocuments(file) {
  const docs = YAML.parseAllDocuments(fs.readFileSync(file, 'utf8'));
  for (const doc of docs) {
    if (doc.errors.length) {
      throw new Error(`${file}: ${doc.errors[0].message}`);
    }
  }
  return docs.map((doc) => doc.toJS()).filter((d) => d !== null);
}

function idOf(object) {
  return `${object.kind}/${object.metadata.name}`;
}

function strategicMerge(base, patch) {
  if (patch === null) return undefined;
  if (Array.isArray(base) || Array.isArray(patch) ||
      typeof base !== 'object' || typeof patch !== 'object' ||
      base === null) {
    return structuredClone(patch);
  }
  const out = structuredClone(base);
  for (const [key, value] of Object.entries(patch)) {
    const mergeKey = MERGE_KEYS[key];
    if (value === null) {
      delete out[key];
    } else if (mergeKey && Array.isArray(value) && Array.isArray(out[key])) {
      out[key] = mergeList(out[key], value, mergeKey);
    } else if (key in out) {
      out[key] = strategicMerge(out[key], value);
    } else {
      out[key] = structuredClone(value);
    }
  }
  return out;
}

function mergeList(base, patch, mergeKey) {
  const out = structuredClone(base);
  for (const item of patch) {
    const key = typeof mergeKey === 'function' ? mergeKey(item) : mergeKey;
    const i = out.findIndex((b) => b[key] === item[key]);
    if (i < 0) {
      out.push(structuredClone(item));
    } else {
      out[i] = strategicMerge(out[i], item);
    }
  }
  return out;
}

// Reads a generator's files ("key=path" or "path") and literals.
function generatorData(dir, generator) {
  const data = {};
  for (const entry of generator.files ?? []) {
    const [key, file] = entry.includes('=') ?
      entry.split('=', 2) : [path.basename(entry), entry];
    data[key] = fs.readFileSync(path.join(dir, file), 'utf8');
  }
  for (const entry of generator.literals ?? []) {
    const i = entry.indexOf('=');
    data[entry.slice(0, i)] = entry.slice(i + 1);
  }
  return data;
}

function generate(dir, generator, kind) {
  const data = generatorData(dir, generator);
  const object = {apiVersion: 'v1', kind, metadata: {name: generator.name}};
  if (kind === 'Secret') {
    object.type = generator.type ?? 'Opaque';
    object.data = Object.fromEntries(Object.entries(data).map(
        ([k, v]) => [k, Buffer.from(v).toString('base64')]));
  } else {
    object.data = data;
  }
  return object;
}

function applyGenerator(objects, dir, generator, kind) {
  const generated = generate(dir, generator, kind);
  const i = objects.findIndex((o) => idOf(o) === idOf(generated));
  const behavior = generator.behavior ?? 'create';
  if (behavior === 'create') {
    if (i >= 0) throw new Error(`${dir}: ${idOf(generated)} exists already`);
    objects.push(generated);
  } else if (i < 0) {
    throw new Error(`${dir}: ${behavior} of missing ${idOf(generated)}`);
  } else if (behavior === 'replace') {
    generated.metadata = objects[i].metadata;
    objects[i] = generated;
  } else if (behavior === 'merge') {
    objects[i].data = {...objects[i].data, ...generated.data};
  } else {
    throw new Error(`${dir}: unknown generator behavior '${behavior}'`);
  }
}

function podSpecs(object) {
  const template = object.spec?.template?.spec;
  return template ? [template] : [];
}

// kubectl's version line when `kubectl kustomize` can render deploy/
// (kustomize v4 or later); null otherwise. Asked once.
let kubectlVersion;
function kubectlKustomize() {
  if (kubectlVersion !== undefined) return kubectlVersion;
  kubectlVersion = null;
  try {
    const out = childProcess.execFileSync('kubectl', ['version', '--client'],
        {encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore']});
    const m = out.match(/Kustomize Version: v(\d+)\S*/);
    if (m && Number(m[1]) >= 4) kubectlVersion = m[0];
  } catch (e) {
    // No kubectl here.
  }
  return kubectlVersion;
}

// Which renderer render() uses, for messages.
function renderer() {
  if (process.env.SYNCNORM_KUSTOMIZE !== 'js' && kubectlKustomize()) {
    return `kubectl kustomize (${kubectlKustomize()})`;
  }
  return 'deploy/tools/kustomize.js';
}

// `kubectl kustomize dir`'s objects. The load restrictor is off because
// the test suite's runfiles are symlinks out of the kustomization root.
function renderWithKubectl(dir) {
  const out = childProcess.execFileSync('kubectl',
      ['kustomize', '--load-restrictor=LoadRestrictionsNone', dir],
      {encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe']});
  return YAML.parseAllDocuments(out).map((d) => d.toJS())
      .filter((d) => d !== null);
}

// Renders the kustomization in `dir`; returns its objects.
function render(dir) {
  if (process.env.SYNCNORM_KUSTOMIZE !== 'js' && kubectlKustomize()) {
    return renderWithKubectl(dir);
  }
  return renderWithJs(dir);
}

// The objects of a kustomization's `resources` (files and folders).
function readResources(dir, resources) {
  return (resources ?? []).flatMap((resource) => {
    const where = path.join(dir, resource);
    return fs.statSync(where).isDirectory() ?
      renderWithJs(where) : readYamlDocuments(where);
  });
}

// The small renderer.
function renderWithJs(dir) {
  const file = path.join(dir, 'kustomization.yaml');
  const [k] = readYamlDocuments(file);
  for (const field of Object.keys(k)) {
    if (!KNOWN_FIELDS.has(field)) {
      throw new Error(`${file}: field '${field}' is not supported by ` +
                      'deploy/tools/kustomize.js; add it there first');
    }
  }
  let objects = readResources(dir, k.resources);
  // As kustomize: a component's resources join after the includer's own,
  // before its generators and transformers (which then apply to them too).
  for (const component of k.components ?? []) {
    const where = path.join(dir, component);
    const [c] = readYamlDocuments(path.join(where, 'kustomization.yaml'));
    if (c.kind !== 'Component') {
      throw new Error(`${file}: component ${component} is not a Component`);
    }
    for (const field of Object.keys(c)) {
      if (!COMPONENT_FIELDS.has(field)) {
        throw new Error(`${where}: component field '${field}' is not ` +
                        'supported by deploy/tools/kustomize.js');
      }
    }
    objects.push(...readResources(where, c.resources));
  }
  for (const generator of k.configMapGenerator ?? []) {
    applyGenerator(objects, dir, generator, 'ConfigMap');
  }
  for (const generator of k.secretGenerator ?? []) {
    applyGenerator(objects, dir, generator, 'Secret');
  }
  for (const patch of k.patches ?? []) {
    if (!patch.path || patch.target || patch.patch) {
      throw new Error(`${file}: only 'patches: - path: <strategic merge ` +
                      'patch>\' is supported');
    }
    for (const p of readYamlDocuments(path.join(dir, patch.path))) {
      const i = objects.findIndex((o) => idOf(o) === idOf(p));
      if (i < 0) throw new Error(`${file}: patch target ${idOf(p)} missing`);
      objects[i] = strategicMerge(objects[i], p);
    }
  }
  for (const {name, count} of k.replicas ?? []) {
    const target = objects.find((o) => o.metadata.name === name &&
                                       o.spec?.replicas !== undefined);
    if (!target) throw new Error(`${file}: replicas of missing ${name}`);
    target.spec.replicas = count;
  }
  for (const image of k.images ?? []) {
    for (const spec of objects.flatMap(podSpecs)) {
      for (const c of [...(spec.containers ?? []),
        ...(spec.initContainers ?? [])]) {
        // "registry:5000/repo/name:tag": the tag follows the last '/'.
        const colon = c.image.lastIndexOf(':');
        const [name, tag] = colon > c.image.lastIndexOf('/') ?
          [c.image.slice(0, colon), c.image.slice(colon + 1)] : [c.image, ''];
        if (name !== image.name) continue;
        c.image = `${image.newName ?? name}` +
            (image.newTag ?? tag ? `:${image.newTag ?? tag}` : '');
      }
    }
  }
  for (const {pairs, includeSelectors, includeTemplates} of k.labels ?? []) {
    if (includeSelectors || includeTemplates) {
      throw new Error(`${file}: labels only on metadata are supported`);
    }
    for (const o of objects) {
      o.metadata.labels = {...o.metadata.labels, ...pairs};
    }
  }
  if (k.namespace) {
    objects = objects.map((o) => {
      if (CLUSTER_SCOPED.has(o.kind)) return o;
      return {...o, metadata: {...o.metadata, namespace: k.namespace}};
    });
  }
  return objects;
}

module.exports = {render, renderWithJs, renderWithKubectl, kubectlKustomize,
  renderer, readYamlDocuments, strategicMerge};
