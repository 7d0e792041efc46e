// Writes a small data dir with an aggregator binary, for the on-disk
// compatibility test (tests/compat_test.cc): jobs with every kind of record
// (job specs of each momentum rule, groups, a quorum and a shard
// assignment; layer states, retry windows, a quorum round, tagged and
// untagged checkpoints, a restore), through a generic gRPC client
// (@grpc/grpc-js), and expected.json beside it with
//   - `reference`: the running statistics replayed here in float64 from the
//     contributions (two-pass merge, the torch/decay/cumulative rules as
//     their frameworks document them), independent of the server's code;
//   - `written`: what the writing server answered (bit for bit, as JSON's
//     shortest round-trip numbers), and the answer to a round that a retry
//     must get again.
//
// Run once per release whose format the suite pins, with that release's
// binary:
//   NODE_PATH=tools/node/node_modules node tests/compat/write_data_dir.js \
//     --aggregator=bazel-bin/server/syncnorm-aggregator \
//     --release="syncnorm 0.3.0 (2babafa)" --out=tests/compat/0.3.0
'use strict';

const assert = require('node:assert/strict');
const childProcess = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

function flags() {
  const out = {};
  for (const a of process.argv.slice(2)) {
    const m = a.match(/^--([a-z_]+)=(.*)$/);
    if (!m) throw new Error(`bad argument ${a}`);
    out[m[1]] = m[2];
  }
  for (const f of ['aggregator', 'out', 'release']) {
    if (!out[f]) throw new Error(`--${f}= is required`);
  }
  return out;
}

function loadContract() {
  const definition = protoLoader.loadSync('syncnorm/v1/aggregator.proto', {
    includeDirs: [path.join(__dirname, '..', '..', 'proto')],
    keepCase: true, longs: String, enums: String, defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).syncnorm.v1;
}

function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, {deadline: Date.now() + 20000},
        (e, r) => (e ? reject(new Error(`${method}: ${e.message}`)) :
          resolve(r)));
  });
}

async function startAggregator(binary, dataDir, scratch) {
  const portFile = path.join(scratch, 'port');
  fs.rmSync(portFile, {force: true});
  const log = fs.openSync(path.join(scratch, 'aggregator.log'), 'a');
  const child = childProcess.spawn(binary, [
    '--listen=127.0.0.1:0', `--port_file=${portFile}`,
    `--data_dir=${dataDir}`, '--round_timeout_ms=20000',
    '--keep_checkpoints=5',
  ], {stdio: ['ignore', log, log]});
  const deadline = Date.now() + 20000;
  while (!fs.existsSync(portFile)) {
    if (child.exitCode !== null || Date.now() > deadline) {
      throw new Error('the aggregator did not start');
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  const port = Number(fs.readFileSync(portFile, 'utf8').trim());
  return {child, address: `127.0.0.1:${port}`};
}

// ---- the jobs ---------------------------------------------------------------

const JOBS = [
  {
    job_id: 'compat-torch', world_size: 2, group_size: 0,
    round_timeout_ms: '20000',
    layers: [
      {name: 'features.0.bn', num_features: 3},
      {name: 'features.1.bn', num_features: 2, momentum_mode: 'MOMENTUM_DECAY',
        momentum: 0.8, biased_running_var: true,
        initial_running_mean: [0.5, -1.25], initial_running_var: [2, 0.75]},
      {name: 'head.bn', num_features: 2, no_running_stats: true},
    ],
    steps: 5, checkpoints: [[2, 'warm'], [4, '']], restore: null,
  },
  {
    // Two groups, the cumulative rule, a quorum: rank 1 skips step 2, whose
    // round completes with rank 0 after the grace period.
    job_id: 'compat-groups', world_size: 4, group_size: 2,
    round_timeout_ms: '20000', quorum: {min_ranks: 1, grace_ms: '200'},
    layers: [{name: 'bn', num_features: 4,
      momentum_mode: 'MOMENTUM_CUMULATIVE'}],
    steps: 4, skip: {rank: 1, step: 2}, checkpoints: [[1, '']],
    restore: null,
  },
  {
    // Shard 1 of 2, holding layer 0; rolled back to its checkpoint at 1
    // after step 2, then steps 2 and 3 again with other values.
    job_id: 'compat-shard', world_size: 2, group_size: 0,
    round_timeout_ms: '20000',
    shard: {shard: 1, num_shards: 2, owned_layers: [0]},
    layers: [{name: 'a.bn', num_features: 2}, {name: 'b.bn', num_features: 2}],
    owned: [0], steps: 4, checkpoints: [[1, 'before']], restore: {after: 2,
      to: 1},
  },
];

// A rank's local moments: deterministic, uneven counts, not round numbers.
function moments(job, layer, step, rank, channels, epoch) {
  const count = 3 + ((rank + step + layer) % 4);
  const mean = [];
  const m2 = [];
  for (let c = 0; c < channels; ++c) {
    mean.push(Math.sin(1 + c + 3 * rank + 7 * step + 11 * layer + 13 * epoch) +
              0.1 * job.job_id.length);
    m2.push(count * (0.25 + Math.abs(Math.cos(c + rank - step + epoch))));
  }
  return {count: String(count), mean, m2};
}

function gradSums(layer, step, rank, channels) {
  return {
    sum_dy: Array.from({length: channels},
        (_, c) => Math.cos(c + rank + step + layer)),
    sum_dy_xmu: Array.from({length: channels},
        (_, c) => Math.sin(c - rank + 2 * step)),
  };
}

// ---- the independent reference ---------------------------------------------

// Two-pass merge (not the server's Chan fold).
function merge(parts, channels) {
  const n = parts.reduce((s, m) => s + Number(m.count), 0);
  const mean = [];
  const variance = [];
  for (let c = 0; c < channels; ++c) {
    let sum = 0;
    for (const m of parts) sum += Number(m.count) * m.mean[c];
    const mu = sum / n;
    let m2 = 0;
    for (const m of parts) m2 += m.m2[c] + Number(m.count) * (m.mean[c] - mu) ** 2;
    mean.push(mu);
    variance.push(m2 / n);
  }
  return {n, mean, var: variance};
}

function initialStats(layer) {
  const c = layer.num_features;
  return {
    num_batches_tracked: 0,
    running_mean: layer.initial_running_mean?.length ?
      [...layer.initial_running_mean] : Array(c).fill(0),
    running_var: layer.initial_running_var?.length ?
      [...layer.initial_running_var] : Array(c).fill(1),
  };
}

// torch: (1-m) r + m b, default m 0.1, unbiased var; decay (MegEngine,
// MXNet): m r + (1-m) b; cumulative (torch momentum=None): the mean of all
// batches so far.
function update(stats, layer, batch) {
  if (layer.no_running_stats) return stats;
  const mode = layer.momentum_mode ?? 'MOMENTUM_TORCH';
  const m = layer.momentum || (mode === 'MOMENTUM_DECAY' ? 0.9 : 0.1);
  const k = stats.num_batches_tracked + 1;
  const rule = (r, b) => {
    if (mode === 'MOMENTUM_DECAY') return m * r + (1 - m) * b;
    if (mode === 'MOMENTUM_CUMULATIVE') return r + (b - r) / k;
    return (1 - m) * r + m * b;
  };
  const sample = batch.var.map(
      (v) => (layer.biased_running_var ? v : v * batch.n / (batch.n - 1)));
  return {
    num_batches_tracked: k,
    running_mean: stats.running_mean.map((r, c) => rule(r, batch.mean[c])),
    running_var: stats.running_var.map((r, c) => rule(r, sample[c])),
  };
}

// ---- driving the server ----------------------------------------------------

async function run(client, job, reference) {
  const create = {...job};
  for (const k of ['steps', 'skip', 'checkpoints', 'restore', 'owned']) {
    delete create[k];
  }
  await unary(client, 'CreateJob', create);
  const groupSize = job.group_size || job.world_size;
  const groups = job.world_size / groupSize;
  const owned = job.owned ?? job.layers.map((_, i) => i);
  // reference[group][layer] = stats; checkpoints[step] = copy of it.
  const state = [];
  for (let g = 0; g < groups; ++g) {
    state.push(job.layers.map((l) => initialStats(l)));
  }
  const checkpointState = {};
  const rounds = [];
  let epoch = 0;
  const stepOrder = [];
  for (let s = 0; s < job.steps; ++s) {
    stepOrder.push(s);
    if (job.restore && s === job.restore.after) {
      stepOrder.push('restore');
      for (let t = job.restore.to + 1; t <= job.restore.after; ++t) {
        stepOrder.push(t);
      }
    }
  }
  for (const s of stepOrder) {
    if (s === 'restore') {
      await unary(client, 'RestoreCheckpoint',
          {job_id: job.job_id, step: String(job.restore.to)});
      for (let g = 0; g < groups; ++g) {
        state[g] = structuredClone(checkpointState[job.restore.to][g]);
      }
      ++epoch;
      continue;
    }
    for (const layer of owned) {
      const spec = job.layers[layer];
      for (let g = 0; g < groups; ++g) {
        const ranks = [];
        for (let r = g * groupSize; r < (g + 1) * groupSize; ++r) {
          if (job.skip && job.skip.rank === r && job.skip.step === s) continue;
          ranks.push(r);
        }
        const parts = ranks.map(
            (r) => moments(job, layer, s, r, spec.num_features, epoch));
        const results = await Promise.all(ranks.map((r, i) =>
          unary(client, 'ReduceOnce', {job_id: job.job_id, layer, step:
            String(s), phase: 'FORWARD', rank: r, moments: parts[i]})));
        for (const result of results) {
          assert.equal(result.outcome, 'moments', JSON.stringify(result));
        }
        const batch = merge(parts, spec.num_features);
        state[g][layer] = update(state[g][layer], spec, batch);
        await Promise.all(ranks.map((r) =>
          unary(client, 'ReduceOnce', {job_id: job.job_id, layer, step:
            String(s), phase: 'BACKWARD', rank: r,
          grad_sums: gradSums(layer, s, r, spec.num_features)})));
        rounds.push({layer, step: s, group: g, rank: ranks[0],
          contribution: parts[0], result: results[0]});
      }
    }
    for (const [step, tag] of job.checkpoints) {
      if (step !== s || checkpointState[step]) continue;
      await unary(client, 'Checkpoint',
          {job_id: job.job_id, step: String(step), tag});
      checkpointState[step] = structuredClone(state);
    }
  }
  // A retry must get these answers again: the last round, and a quorum
  // round (whose stored answer names the rank it went without).
  const retries = [rounds[rounds.length - 1],
    ...rounds.filter((r) => r.result.missing_ranks.length > 0)];
  reference[job.job_id] = {state, checkpointState, retries, groups, owned};
}

function statsOf(answer) {
  return answer.layers.map((l) => ({
    layer: l.layer, num_batches_tracked: Number(l.num_batches_tracked),
    running_mean: l.running_mean, running_var: l.running_var,
  }));
}

async function record(client, job, ref) {
  const info = await unary(client, 'GetJob', {job_id: job.job_id});
  const listed = await unary(client, 'ListCheckpoints', {job_id: job.job_id});
  const out = {
    job_id: job.job_id,
    committed_step: Number(info.committed_step),
    world_size: job.world_size, group_size: info.group_size,
    layers: job.layers.map((l) => l.name),
    owned_layers: ref.owned,
    checkpoints: listed.checkpoints.map((c) => ({step: Number(c.step),
      tag: c.tag, created_unix_ms: Number(c.created_unix_ms)})),
    reference: {latest: [], checkpoints: {}},
    written: {latest: [], checkpoints: {}},
    retries: ref.retries.map((r) => ({layer: r.layer, step: r.step,
      rank: r.rank, moments: r.contribution,
      result: {count: Number(r.result.moments.count),
        mean: r.result.moments.mean, var: r.result.moments.var,
        version: Number(r.result.version),
        missing_ranks: r.result.missing_ranks}})),
  };
  const pick = (state) => ref.owned.map((l) => ({layer: l, ...state[l]}));
  for (let g = 0; g < ref.groups; ++g) {
    out.reference.latest.push(pick(ref.state[g]));
    const answer = await unary(client, 'GetRunningStats',
        {job_id: job.job_id, group: g});
    out.written.latest.push(statsOf(answer));
  }
  for (const c of out.checkpoints) {
    out.reference.checkpoints[c.step] = [];
    out.written.checkpoints[c.step] = [];
    for (let g = 0; g < ref.groups; ++g) {
      out.reference.checkpoints[c.step].push(
          pick(ref.checkpointState[c.step][g]));
      const answer = await unary(client, 'GetRunningStats', {job_id:
        job.job_id, group: g, checkpoint_step: String(c.step),
      use_checkpoint: true});
      out.written.checkpoints[c.step].push(statsOf(answer));
    }
  }
  return out;
}

async function main() {
  const {aggregator, out, release} = flags();
  const dataDir = path.join(out, 'data');
  fs.rmSync(dataDir, {recursive: true, force: true});
  fs.mkdirSync(out, {recursive: true});
  const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'syncnorm-compat-'));
  const v1 = loadContract();
  const reference = {};
  const jobs = [];
  // The first jobs end up in table files (a graceful stop flushes), the
  // last one only in the write-ahead log (a kill -9 does not): a data dir
  // as a crashed pod leaves it.
  for (const [part, signal] of [[JOBS.slice(0, -1), 'SIGTERM'],
    [JOBS.slice(-1), 'SIGKILL']]) {
    const server = await startAggregator(aggregator, dataDir, scratch);
    const client = new v1.Aggregator(server.address,
        grpc.credentials.createInsecure());
    try {
      for (const job of part) await run(client, job, reference);
      if (signal === 'SIGKILL') {
        for (const job of JOBS) {
          jobs.push(await record(client, job, reference[job.job_id]));
        }
      }
    } finally {
      client.close();
      server.child.kill(signal);
      await new Promise((r) => server.child.on('exit', r));
    }
  }
  fs.rmSync(scratch, {recursive: true, force: true});
  // RocksDB's informational logs and lock file are not state.
  for (const f of fs.readdirSync(dataDir)) {
    if (/^(LOG|LOCK$)/.test(f)) fs.rmSync(path.join(dataDir, f));
  }
  fs.writeFileSync(path.join(out, 'expected.json'), JSON.stringify({
    written_by: release,
    jobs,
  }, null, 1) + '\n');
  console.log(`wrote ${dataDir} and expected.json: ${jobs.length} jobs`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
