// The server binary accepts exactly the args of the StatefulSet, with the
// ConfigMap's flag file, in --check_config mode (parse flags and the flag
// file, validate, exit), for the base and every overlay; and the shutdown
// grace it reports fits terminationGracePeriodSeconds after preStop.
// The pod's volumes are laid out under a scratch folder (deploy/tools/pod.js);
// mount paths are the only thing that changes in the args.
// Run by //deploy:statefulset_args_test from the workspace's runfiles.
'use strict';

const assert = require('node:assert/strict');
const childProcess = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const test = require('node:test');

const {render} = require('./tools/kustomize.js');
const {layOutPod} = require('./tools/pod.js');

const BINARY = path.resolve('server/syncnorm-aggregator');
const KUSTOMIZATIONS = ['deploy/base', ...fs.readdirSync('deploy/overlays')
    .map((o) => `deploy/overlays/${o}`)];
// Time the state store gets to close after the server's grace, at least.
const STORE_CLOSE_SECONDS = 10;

function scratch(name) {
  return fs.mkdtempSync(path.join(process.env.TEST_TMPDIR || os.tmpdir(),
      `${name.replace(/\W/g, '-')}-`));
}

function checkConfig(args) {
  return childProcess.spawnSync(BINARY, ['--check_config', ...args],
      {encoding: 'utf8', timeout: 20000});
}

for (const k of KUSTOMIZATIONS) {
  test(`the binary accepts the StatefulSet's args of ${k}`, () => {
    const root = scratch(k);
    const pod = layOutPod(render(k), root);
    const run = checkConfig(pod.args);
    assert.equal(run.status, 0,
                 `${[BINARY, ...pod.args].join(' ')}\n${run.stderr}`);
    const report = Object.fromEntries(run.stdout.trim()
        .replace(/^.*config ok: /, '').split(' ').map((kv) => kv.split('=')));

    // The args reached the binary unchanged, but for the mount paths.
    assert.equal(report.listen, pod.container.args
        .find((a) => a.startsWith('--listen=')).slice(9));
    const dataDir = pod.container.args
        .find((a) => a.startsWith('--data_dir=')).slice(11);
    assert.equal(report.data_dir, path.join(root, dataDir));
    // And the flag file was read: each flag the binary reports has the
    // file's value.
    const flags = fs.readFileSync(pod.args
        .find((a) => a.startsWith('--flagfile=')).slice(11), 'utf8');
    let seen = 0;
    for (const [, name, value] of flags.matchAll(/^--(\w+)=(.*)$/gm)) {
      if (!(name in report)) continue;
      assert.equal(report[name], {true: '1', false: '0'}[value] ?? value,
                   `--${name}`);
      ++seen;
    }
    assert.ok(seen >= 1, 'the report shows the flag file\'s flags');

    // preStop + the server's grace + closing the store fit the pod's grace.
    const spec = pod.statefulSet.spec.template.spec;
    const preStop = Number(pod.container.lifecycle.preStop.exec.command[1]);
    const grace = Number(report.shutdown_grace_ms) / 1000;
    assert.ok(grace > 0);
    assert.ok(spec.terminationGracePeriodSeconds >=
              preStop + grace + STORE_CLOSE_SECONDS,
              `terminationGracePeriodSeconds ${spec.terminationGracePeriodSeconds}` +
              ` < preStop ${preStop} + grace ${grace} + ${STORE_CLOSE_SECONDS}`);
  });
}

test('--check_config rejects what a rollout would trip on', () => {
  const root = scratch('bad');
  const pod = layOutPod(render('deploy/base'), root);
  const flagfile = pod.args.find((a) => a.startsWith('--flagfile='))
      .slice(11);

  // A flag the binary does not know, in the ConfigMap.
  fs.appendFileSync(flagfile, '--no_such_flag=1\n');
  let run = checkConfig(pod.args);
  assert.notEqual(run.status, 0);
  assert.match(run.stderr, /no_such_flag/);

  // A bad listen address and a data dir that cannot be made.
  fs.writeFileSync(flagfile, '--round_timeout_ms=1000\n');
  run = checkConfig([...pod.args, '--listen=0.0.0.0:70000']);
  assert.equal(run.status, 2);
  assert.match(run.stderr, /--listen='0\.0\.0\.0:70000'/);
  fs.writeFileSync(path.join(root, 'file'), '');
  run = checkConfig([...pod.args, `--data_dir=${root}/file/data`]);
  assert.equal(run.status, 2);
  assert.match(run.stderr, /--data_dir=.*is not a folder/);
  run = checkConfig([...pod.args, '--keep_checkpoints=-1']);
  assert.equal(run.status, 2);
  assert.match(run.stderr, /keep_checkpoints/);
  run = checkConfig([...pod.args, '--round_timeout_ms=0']);
  assert.equal(run.status, 2);
  assert.match(run.stderr, /round_timeout_ms must be positive/);
  // A message limit raised past half of what gRPC's transport may hold.
  run = checkConfig([...pod.args, '--max_message_bytes=1073741824']);
  assert.equal(run.status, 2);
  assert.match(run.stderr, /--max_transport_bytes=\d+ is below twice/);
});
