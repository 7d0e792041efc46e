// deploy/local-cluster: N aggregator shards on loopback, each run with
// exactly the args of the StatefulSet in the manifests (rendered from a
// kustomization, deploy/base by default). Per shard, a folder stands in for
// the pod's volumes (see pod.js); only --listen's address changes, to
// 127.0.0.1 and a port of its own.
'use strict';

const childProcess = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');

const {render} = require('./kustomize.js');
const {layOutPod} = require('./pod.js');
const {checkHealth, waitServing} = require('./health.js');

const USAGE = `usage: deploy/local-cluster COMMAND [--dir=DIR] [options]

  start    [--shards=3] [--base_port=50051] [--kustomization=deploy/base]
           [--binary=bazel-bin/server/syncnorm-aggregator]
           starts the shards (ports base_port .. base_port+N-1; 0 picks free
           ones), waits until each is SERVING, prints their addresses
           (comma-separated) on stdout
  status   health of each shard; exits 1 unless all are SERVING
  restart  --shard=I [--signal=KILL]  kills shard I (as a crash would, or
           TERM for a graceful stop), starts it again on the same folder and
           port, waits until it is SERVING
  stop     SIGTERM to every shard, SIGKILL after the StatefulSet's
           terminationGracePeriodSeconds; exits 1 if any needed SIGKILL

DIR (default /tmp/syncnorm-local-cluster) holds cluster.json and, per shard,
shard-I/ with the pod's volumes laid out under it and aggregator.log.`;

function parseArgs(argv) {
  const [command, ...rest] = argv;
  const options = {};
  for (const arg of rest) {
    const m = arg.match(/^--([a-z_]+)=(.*)$/);
    if (!m) throw new Error(`bad argument '${arg}'\n${USAGE}`);
    options[m[1]] = m[2];
  }
  return {command, options};
}

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

// False once the process is gone or a zombie nobody reaps.
function alive(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch (e) {
    return false;
  }
}

async function waitExit(pid, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (alive(pid)) {
    if (Date.now() > deadline) return false;
    await sleep(50);
  }
  return true;
}

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const {port} = server.address();
      server.close(() => resolve(port));
    });
  });
}

function loadCluster(dir) {
  const file = path.join(dir, 'cluster.json');
  if (!fs.existsSync(file)) throw new Error(`no cluster in ${dir}`);
  return JSON.parse(fs.readFileSync(file, 'utf8'));
}

function saveCluster(dir, cluster) {
  fs.writeFileSync(path.join(dir, 'cluster.json'),
      JSON.stringify(cluster, null, 2) + '\n');
}

function spawnShard(cluster, shard) {
  const log = fs.openSync(path.join(shard.root, 'aggregator.log'), 'a');
  const child = childProcess.spawn(cluster.binary, shard.args,
      {detached: true, stdio: ['ignore', log, log]});
  child.unref();
  fs.closeSync(log);
  shard.pid = child.pid;
}

function logTail(shard) {
  const text = fs.readFileSync(path.join(shard.root, 'aggregator.log'),
      'utf8');
  return text.split('\n').slice(-10).join('\n');
}

// Waits until the shard is SERVING; fails early if its process exits.
async function waitShard(shard) {
  const deadline = Date.now() + 30000;
  while (Date.now() < deadline && alive(shard.pid)) {
    if (await waitServing(shard.address, 500)) return;
  }
  throw new Error(`shard ${shard.index} (${shard.address}) did not ` +
                  `become SERVING:\n${logTail(shard)}`);
}

// One shard's args: the StatefulSet's, localized, --listen (and
// --metrics_listen) on loopback.
function shardArgs(podArgs, port, metricsPort) {
  let listens = 0;
  const args = podArgs.map((a) => {
    if (/^--metrics_listen=.+$/.test(a)) {
      return `--metrics_listen=127.0.0.1:${metricsPort}`;
    }
    const m = a.match(/^--listen=(.*):(\d+)$/);
    if (!m) return a;
    ++listens;
    return `--listen=127.0.0.1:${port}`;
  });
  if (listens !== 1) throw new Error('the StatefulSet must pass --listen once');
  return args;
}

async function start(dir, options, checkout) {
  const n = Number(options.shards ?? 3);
  const basePort = Number(options.base_port ?? 50051);
  const binary = path.resolve(checkout, options.binary ??
                              'bazel-bin/server/syncnorm-aggregator');
  const kustomization = path.resolve(checkout,
      options.kustomization ?? 'deploy/base');
  if (!fs.existsSync(binary)) {
    throw new Error(`${binary} is missing: ` +
                    'bazel build //server:syncnorm-aggregator');
  }
  if (fs.existsSync(path.join(dir, 'cluster.json')) &&
      loadCluster(dir).shards.some((s) => alive(s.pid))) {
    throw new Error(`a cluster runs in ${dir}: stop it first`);
  }
  const objects = render(kustomization);
  const cluster = {binary, kustomization, shards: []};
  for (let i = 0; i < n; ++i) {
    const root = path.join(dir, `shard-${i}`);
    fs.rmSync(root, {recursive: true, force: true});
    const pod = layOutPod(objects, root);
    cluster.graceSeconds =
        pod.statefulSet.spec.template.spec.terminationGracePeriodSeconds ?? 30;
    const port = basePort === 0 ? await freePort() : basePort + i;
    const metricsPort = await freePort();
    cluster.shards.push({index: i, root, address: `127.0.0.1:${port}`,
      metrics: `127.0.0.1:${metricsPort}`,
      args: shardArgs(pod.args, port, metricsPort)});
  }
  try {
    for (const shard of cluster.shards) spawnShard(cluster, shard);
    saveCluster(dir, cluster);
    for (const shard of cluster.shards) await waitShard(shard);
  } catch (e) {
    await stop(dir);
    throw e;
  }
  for (const shard of cluster.shards) {
    process.stderr.write(`shard ${shard.index}: ${shard.address} pid ` +
        `${shard.pid} metrics http://${shard.metrics}/metrics: ` +
        `${[cluster.binary, ...shard.args].join(' ')}\n`);
  }
  console.log(cluster.shards.map((s) => s.address).join(','));
}

async function status(dir) {
  let serving = 0;
  const {shards} = loadCluster(dir);
  for (const shard of shards) {
    let state;
    try {
      state = await checkHealth(shard.address);
    } catch (e) {
      state = `unreachable (${e.details || e.message})`;
    }
    if (state === 'SERVING') ++serving;
    console.log(`shard ${shard.index} ${shard.address} pid ${shard.pid} ` +
                `${alive(shard.pid) ? 'running' : 'exited'} ${state}`);
  }
  return serving === shards.length;
}

async function restart(dir, options) {
  const cluster = loadCluster(dir);
  const shard = cluster.shards[Number(options.shard)];
  if (!shard) throw new Error(`no shard '${options.shard}'`);
  const signal = `SIG${options.signal ?? 'KILL'}`;
  if (alive(shard.pid)) process.kill(shard.pid, signal);
  if (!(await waitExit(shard.pid, cluster.graceSeconds * 1000))) {
    throw new Error(`shard ${shard.index} did not exit after ${signal}`);
  }
  spawnShard(cluster, shard);
  await waitShard(shard);
  saveCluster(dir, cluster);
  console.log(`shard ${shard.index} ${shard.address} pid ${shard.pid} ` +
              'SERVING again');
}

async function stop(dir) {
  const cluster = loadCluster(dir);
  let forced = 0;
  for (const shard of cluster.shards) {
    if (shard.pid && alive(shard.pid)) process.kill(shard.pid, 'SIGTERM');
  }
  for (const shard of cluster.shards) {
    if (!shard.pid) continue;
    if (!(await waitExit(shard.pid, cluster.graceSeconds * 1000))) {
      process.kill(shard.pid, 'SIGKILL');
      ++forced;
      console.log(`shard ${shard.index}: killed after ` +
                  `${cluster.graceSeconds} s`);
    } else {
      console.log(`shard ${shard.index}: stopped`);
    }
  }
  return forced === 0;
}

async function main() {
  const checkout = process.env.SYNCNORM_CHECKOUT;
  const {command, options} = parseArgs(process.argv.slice(2));
  const dir = path.resolve(options.dir ?? '/tmp/syncnorm-local-cluster');
  fs.mkdirSync(dir, {recursive: true});
  switch (command) {
    case 'start': await start(dir, options, checkout); return 0;
    case 'status': return (await status(dir)) ? 0 : 1;
    case 'restart': await restart(dir, options); return 0;
    case 'stop': return (await stop(dir)) ? 0 : 1;
    default: console.error(USAGE); return 2;
  }
}

main().then((code) => process.exit(code), (e) => {
  console.error(`local-cluster: ${e.message}`);
  process.exit(1);
});
