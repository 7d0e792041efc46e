// Interop: the wire contract works for another gRPC implementation.
//
// A Node.js client (@grpc/grpc-js, proto/ loaded as it is by
// @grpc/proto-loader) creates a job of world size 3 and takes part in its
// rounds as rank 2 over one Reduce stream, beside ranks 0 and 1, which are
// C++ processes using the C++ client (interop-contributor). All three must
// get the same global statistics, equal to a float64 merge computed here
// independently; then an in-band error on the stream (a wrong channel count)
// leaves the stream usable, and the running statistics match a JS replay.
//
// Run by //tests/interop:interop_test (from the workspace's runfiles).
'use strict';

const assert = require('node:assert/strict');
const childProcess = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const test = require('node:test');

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const AGGREGATOR = 'server/syncnorm-aggregator';
const CONTRIBUTOR = 'tests/interop/interop-contributor';
const PROTO = 'syncnorm/v1/aggregator.proto';  // under proto/
const JOB = 'interop-node-cpp';
const CHANNELS = 4;
const STEPS = 3;
const JS_RANK = 2;
const RELATIVE_TOLERANCE = 1e-12;

const scratch = fs.mkdtempSync(
    path.join(process.env.TEST_TMPDIR || os.tmpdir(), 'interop-'));

// ---- the server and the C++ ranks ----------------------------------------

async function startAggregator() {
  const portFile = path.join(scratch, 'port');
  const log = fs.openSync(path.join(scratch, 'aggregator.log'), 'w');
  const child = childProcess.spawn(AGGREGATOR, [
    '--listen=127.0.0.1:0', `--port_file=${portFile}`,
    `--data_dir=${path.join(scratch, 'data')}`, '--round_timeout_ms=20000',
  ], {stdio: ['ignore', log, log]});
  const deadline = Date.now() + 20000;
  while (!fs.existsSync(portFile)) {
    if (child.exitCode !== null || Date.now() > deadline) {
      throw new Error('the aggregator did not start: ' +
                      fs.readFileSync(path.join(scratch, 'aggregator.log')));
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  const port = Number(fs.readFileSync(portFile, 'utf8').trim());
  return {child, address: `127.0.0.1:${port}`};
}

// Runs one C++ rank; resolves to its JSON lines once it exits 0.
function runCppRank(address, rank) {
  return new Promise((resolve, reject) => {
    const child = childProcess.spawn(CONTRIBUTOR, [
      `--address=${address}`, `--job_id=${JOB}`, `--rank=${rank}`,
      `--channels=${CHANNELS}`, `--steps=${STEPS}`,
    ], {stdio: ['ignore', 'pipe', 'pipe']});
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.on('exit', (code) => {
      if (code !== 0) {
        reject(new Error(`C++ rank ${rank} exited ${code}: ${err}`));
        return;
      }
      resolve(out.trim().split('\n').map((line) => JSON.parse(line)));
    });
  });
}

// ---- the Node.js rank ------------------------------------------------------

function loadContract() {
  const definition = protoLoader.loadSync(PROTO, {
    includeDirs: ['proto'],
    keepCase: true,   // field names exactly as in the .proto
    longs: String,    // int64 as decimal strings: no precision loss
    enums: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).syncnorm.v1;
}

function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, {deadline: Date.now() + 20000},
        (error, response) => (error ? reject(error) : resolve(response)));
  });
}

// One Reduce stream; round(contribution) resolves to the RoundResult that
// echoes its (layer, step, phase).
class ReduceStream {
  constructor(client) {
    this.waiting = new Map();
    this.call = client.Reduce();
    this.call.on('data', (result) => {
      const key = `${result.layer}/${result.step}/${result.phase}`;
      const resolve = this.waiting.get(key);
      assert.ok(resolve, `unexpected result ${JSON.stringify(result)}`);
      this.waiting.delete(key);
      resolve(result);
    });
    this.call.on('error', (error) => {
      for (const [key] of this.waiting) {
        this.waiting.delete(key);
      }
      this.error = error;
    });
  }

  round(contribution) {
    const key =
        `${contribution.layer}/${contribution.step}/${contribution.phase}`;
    return new Promise((resolve) => {
      this.waiting.set(key, resolve);
      this.call.write(contribution);
    });
  }

  close() {
    this.call.end();
  }
}

// Rank 2's own values: different from the C++ ranks', uneven count.
function jsMoments(step) {
  const count = 4 + step;
  return {
    count: String(count),
    mean: Array.from({length: CHANNELS}, (_, c) => 0.25 * c - 0.1 * step + 1),
    m2: Array.from({length: CHANNELS}, (_, c) => count * (0.3 + 0.2 * c)),
  };
}

function jsGradSums(step) {
  return {
    sum_dy: Array.from({length: CHANNELS}, (_, c) => 0.5 - 0.125 * c + step),
    sum_dy_xmu: Array.from({length: CHANNELS}, (_, c) => -0.75 + 0.05 * c),
  };
}

// ---- the independent reference -------------------------------------------

// Global statistics by the two-pass form: mean = sum(n_r mean_r) / N,
// M2 = sum(m2_r + n_r (mean_r - mean)^2). Not the Chan fold the server
// uses, so agreement is a real check, not the same arithmetic twice.
function referenceMerge(contributions) {
  const n = contributions.reduce((s, m) => s + Number(m.count), 0);
  const mean = [];
  const variance = [];
  for (let c = 0; c < CHANNELS; ++c) {
    let sum = 0;
    for (const m of contributions) sum += Number(m.count) * m.mean[c];
    const mu = sum / n;
    let m2 = 0;
    for (const m of contributions) {
      m2 += m.m2[c] + Number(m.count) * (m.mean[c] - mu) ** 2;
    }
    mean.push(mu);
    variance.push(m2 / n);
  }
  return {count: n, mean, var: variance};
}

function assertClose(actual, expected, what) {
  assert.equal(actual.length, expected.length, `${what}: length`);
  for (let i = 0; i < expected.length; ++i) {
    const scale = Math.max(1, Math.abs(expected[i]));
    assert.ok(Math.abs(actual[i] - expected[i]) <= RELATIVE_TOLERANCE * scale,
              `${what}[${i}]: ${actual[i]} vs reference ${expected[i]}`);
  }
}

// protobuf's JSON mapping (C++ output) writes int64 as strings and leaves
// out nothing with always_print_primitive_fields; proto-loader gives the
// same shapes. Normalise both to numbers.
function globalOf(result) {
  assert.equal(result.outcome ?? 'moments', 'moments',
               `round failed: ${JSON.stringify(result.error)}`);
  return {
    count: Number(result.moments.count),
    mean: result.moments.mean.map(Number),
    var: result.moments.var.map(Number),
  };
}

// ---- the test --------------------------------------------------------------

test('Node.js rank 2 and C++ ranks 0, 1 share rounds', async (t) => {
  const server = await startAggregator();
  t.after(() => server.child.kill('SIGKILL'));
  const v1 = loadContract();
  const client = new v1.Aggregator(server.address,
                                   grpc.credentials.createInsecure());
  t.after(() => client.close());

  const job = await unary(client, 'CreateJob', {
    job_id: JOB, world_size: 3, round_timeout_ms: 20000,
    layers: [{name: 'bn0', num_features: CHANNELS}],
  });
  assert.equal(job.job_id, JOB);
  assert.equal(job.world_size, 3);
  assert.equal(job.layers[0].momentum_mode, 'MOMENTUM_TORCH');

  const cppRanks = [0, 1].map((r) => runCppRank(server.address, r));
  const stream = new ReduceStream(client);
  const mine = [];
  for (let step = 0; step < STEPS; ++step) {
    const base = {job_id: JOB, layer: 0, step: String(step), rank: JS_RANK};
    if (step === 1) {
      // In-band error: a wrong channel count fails this contribution alone
      // with INVALID_ARGUMENT, and the same stream carries the good one.
      const bad = await stream.round({...base, phase: 'FORWARD',
        moments: {count: '2', mean: [0, 0, 0], m2: [0, 0, 0]}});
      assert.equal(bad.outcome, 'error');
      assert.equal(bad.error.code, grpc.status.INVALID_ARGUMENT,
                   bad.error.message);
      assert.match(bad.error.message, /channel|features|4|3/);
      assert.equal(bad.job_id, JOB);
      assert.equal(bad.step, '1');
    }
    const forward = await stream.round(
        {...base, phase: 'FORWARD', moments: jsMoments(step)});
    const backward = await stream.round(
        {...base, phase: 'BACKWARD', grad_sums: jsGradSums(step)});
    mine.push({forward, backward});
  }
  stream.close();
  const [rank0, rank1] = await Promise.all(cppRanks);
  assert.equal(stream.error, undefined);

  let running = {mean: Array(CHANNELS).fill(0), var: Array(CHANNELS).fill(1)};
  for (let step = 0; step < STEPS; ++step) {
    const cpp = [rank0, rank1].map((lines) => [lines[2 * step],
                                               lines[2 * step + 1]]);
    for (const [fwd, bwd] of cpp) {
      assert.equal(fwd.sent.phase, 'FORWARD');
      assert.equal(bwd.sent.phase, 'BACKWARD');
      assert.equal(Number(fwd.sent.step), step);
    }
    // Forward: all three ranks hold bitwise the same global statistics.
    const js = globalOf(mine[step].forward);
    for (const [fwd] of cpp) {
      assert.deepEqual(globalOf(fwd.result), js, `step ${step}: C++ vs JS`);
      assert.equal(Number(fwd.result.version), step + 1);
    }
    assert.equal(Number(mine[step].forward.version), step + 1);
    const sent = [cpp[0][0].sent.moments, cpp[1][0].sent.moments,
                  jsMoments(step)].map((m) => ({
      count: Number(m.count ?? 0), mean: m.mean.map(Number),
      m2: m.m2.map(Number)}));
    const reference = referenceMerge(sent);
    assert.equal(js.count, reference.count);
    assertClose(js.mean, reference.mean, `step ${step} mean`);
    assertClose(js.var, reference.var, `step ${step} var`);
    if (step === 1) assert.equal(sent[1].count, 0, 'the empty batch');

    // Backward: plain sums over ranks, in rank order, so exact.
    const grads = [cpp[0][1].sent.grad_sums, cpp[1][1].sent.grad_sums,
                   jsGradSums(step)];
    const sumOf = (field) => Array.from({length: CHANNELS}, (_, c) =>
      grads.reduce((s, g) => s + Number(g[field][c]), 0));
    const jsBackward = mine[step].backward;
    assert.equal(jsBackward.outcome, 'grad_sums');
    assert.deepEqual(jsBackward.grad_sums.sum_dy, sumOf('sum_dy'));
    assert.deepEqual(jsBackward.grad_sums.sum_dy_xmu, sumOf('sum_dy_xmu'));
    assert.equal(Number(jsBackward.version), step + 1);
    for (const [, bwd] of cpp) {
      assert.deepEqual(bwd.result.grad_sums.sum_dy.map(Number),
                       jsBackward.grad_sums.sum_dy);
      assert.equal(Number(bwd.result.version), step + 1);
    }

    // torch's rule, momentum 0.1, unbiased running var.
    running = {
      mean: running.mean.map((r, c) => 0.9 * r + 0.1 * reference.mean[c]),
      var: running.var.map((r, c) => 0.9 * r + 0.1 * reference.var[c] *
                           reference.count / (reference.count - 1)),
    };
  }

  const stats = await unary(client, 'GetRunningStats', {job_id: JOB});
  assert.equal(stats.layers.length, 1);
  assert.equal(stats.layers[0].num_batches_tracked, String(STEPS));
  assertClose(stats.layers[0].running_mean, running.mean, 'running mean');
  assertClose(stats.layers[0].running_var, running.var, 'running var');

  // Errors as RPC status on unary calls, with the contract's codes.
  await assert.rejects(unary(client, 'GetJob', {job_id: 'no-such-job'}),
                       (e) => e.code === grpc.status.NOT_FOUND);
  await assert.rejects(
      unary(client, 'ReduceOnce', {job_id: JOB, layer: 0, step: '0',
        phase: 'FORWARD', rank: 7, moments: jsMoments(0)}),
      (e) => e.code === grpc.status.INVALID_ARGUMENT);
});
