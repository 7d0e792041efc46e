// What a pod of the aggregator StatefulSet sees, laid out in a local folder:
// the files of its ConfigMap and Secret volumes, folders for its volume
// claims and emptyDirs, and the container's args with each mount path moved
// under that folder. deploy/local-cluster runs shards from it, and
// deploy:statefulset_args_test runs the binary's --check_config on it.
'use strict';

const fs = require('node:fs');
const path = require('node:path');

const CONTAINER = 'aggregator';

function find(objects, kind, name) {
  const found = objects.find((o) => o.kind === kind &&
                                    (name === undefined ||
                                     o.metadata.name === name));
  if (!found) throw new Error(`no ${kind}${name ? ' ' + name : ''}`);
  return found;
}

function aggregatorStatefulSet(objects) {
  return find(objects, 'StatefulSet', 'syncnorm-aggregator');
}

function aggregatorContainer(statefulSet) {
  const c = statefulSet.spec.template.spec.containers.find(
      (x) => x.name === CONTAINER);
  if (!c) throw new Error(`StatefulSet has no container '${CONTAINER}'`);
  return c;
}

// The files of a ConfigMap or Secret volume: key -> content. An optional
// Secret the manifests do not hold (the operator creates it) is an empty
// folder, as in a pod when the Secret does not exist.
function volumeFiles(objects, volume) {
  if (volume.configMap) {
    return find(objects, 'ConfigMap', volume.configMap.name).data ?? {};
  }
  if (volume.secret) {
    const present = objects.some((o) => o.kind === 'Secret' &&
                                        o.metadata.name === volume.secret.secretName);
    if (!present && volume.secret.optional) return {};
    const s = find(objects, 'Secret', volume.secret.secretName);
    const decoded = Object.fromEntries(Object.entries(s.data ?? {}).map(
        ([k, v]) => [k, Buffer.from(v, 'base64').toString()]));
    return {...decoded, ...(s.stringData ?? {})};
  }
  return {};
}

// Replaces every mount path that starts a value ("--x=/etc/..." or a bare
// path) or a line of a flag file by its local folder.
function localize(text, mounts) {
  const byPath = new Map(mounts.map((m) => [m.mountPath, m.local]));
  // One pass, longest paths first, so a local folder is never rewritten
  // again (a mount at /tmp would match a local folder under /tmp).
  const alternatives = [...byPath.keys()]
      .sort((a, b) => b.length - a.length)
      .map((p) => p.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
  if (alternatives.length === 0) return text;
  const pattern = new RegExp(`(^|=)(${alternatives.join('|')})(?=/|$|\\s)`,
      'gm');
  return text.replace(pattern, (_, lead, p) => lead + byPath.get(p));
}

// Lays out the pod's volumes under `root` and returns
// {args, mounts: [{name, mountPath, local}], container, statefulSet}.
// Text files of ConfigMap volumes (flag files) get their mount paths
// localized too, so a flag file naming /etc/syncnorm/secrets/... works.
function layOutPod(objects, root) {
  const statefulSet = aggregatorStatefulSet(objects);
  const container = aggregatorContainer(statefulSet);
  const volumes = statefulSet.spec.template.spec.volumes ?? [];
  const claims = statefulSet.spec.volumeClaimTemplates ?? [];
  const mounts = (container.volumeMounts ?? []).map((m) => ({
    name: m.name, mountPath: m.mountPath, local: path.join(root, m.mountPath),
  }));
  for (const m of mounts) {
    const volume = volumes.find((v) => v.name === m.name);
    const claim = claims.find((c) => c.metadata.name === m.name);
    if (!volume && !claim) {
      throw new Error(`volumeMount '${m.name}' has no volume or claim`);
    }
    fs.mkdirSync(m.local, {recursive: true});
    for (const [key, content] of Object.entries(
        volume ? volumeFiles(objects, volume) : {})) {
      const text = volume.configMap ? localize(content, mounts) : content;
      fs.writeFileSync(path.join(m.local, key), text, {mode: 0o600});
    }
  }
  const args = (container.args ?? []).map((a) => localize(a, mounts));
  return {args, mounts, container, statefulSet};
}

module.exports = {aggregatorStatefulSet, aggregatorContainer, layOutPod,
  localize};
