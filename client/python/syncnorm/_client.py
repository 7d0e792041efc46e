"""The syncnorm client: jobs, running statistics and checkpoints as dicts.

Messages are those of proto/syncnorm/v1/aggregator.proto with their proto
field names (``job_id``, ``world_size``, ``layers``, ...). Every call has a
deadline (``rpc_timeout``) and raises :class:`ServiceError` (a RuntimeError
whose ``code`` is the gRPC status name) when the aggregator says no.
"""

import json

from . import _syncnorm

ServiceError = _syncnorm.ServiceError
SingleValuePerChannelError = _syncnorm.SingleValuePerChannelError

# Wire names of the running-statistics rules and their aliases.
MOMENTUM_MODES = {
    "torch": 1,
    "apex": 1,
    "decay": 2,
    "megengine": 2,
    "mxnet": 2,
    "cumulative": 3,
}
_MODE_WIRE = {1: "MOMENTUM_TORCH", 2: "MOMENTUM_DECAY",
              3: "MOMENTUM_CUMULATIVE"}

# int64 fields, which proto3 JSON writes as strings.
_INT64_FIELDS = frozenset(
    ["committed_step", "step", "num_batches_tracked", "round_timeout_ms",
     "created_unix_ms", "count", "checkpoint_step", "grace_ms", "next_step",
     "version", "membership_version", "first_step", "last_step",
     "cleared_step", "flags_in_force", "nonfinite", "nonfinite_total",
     "rounds_scored"])


def momentum_mode_code(mode):
    """1 (torch), 2 (decay) or 3 (cumulative) from a name, a wire name or
    a code."""
    if isinstance(mode, int) and mode in _MODE_WIRE:
        return mode
    if isinstance(mode, str):
        key = mode.lower()
        if key in MOMENTUM_MODES:
            return MOMENTUM_MODES[key]
        for code, wire in _MODE_WIRE.items():
            if mode.upper() == wire:
                return code
    raise ValueError(
        "expected momentum_mode 'torch', 'decay' (MegEngine, MXNet) or "
        "'cumulative' (torch momentum=None), got %r" % (mode,))


# A Membership's sets of ranks come as runs, (first, last) pairs, and as
# rank lists only while they are small (aggregator.proto): this module
# gives lists, as it always has.
_RANK_RUNS = {"member_runs": "members", "joined_runs": "joined",
              "left_runs": "left", "removed_runs": "removed"}


def _rank_lists(value):
    for runs_key, list_key in _RANK_RUNS.items():
        runs = value.pop(runs_key, None)
        if runs:
            value[list_key] = [r for first, last in zip(runs[::2], runs[1::2])
                               for r in range(first, last + 1)]
    return value


def _ints(value, key=None):
    if isinstance(value, dict):
        return _rank_lists({k: _ints(v, k) for k, v in value.items()})
    if isinstance(value, list):
        return [_ints(v, key) for v in value]
    # "version" is also a release's name (BackupInfo): numbers only.
    if key in _INT64_FIELDS and isinstance(value, str) and \
            value.lstrip("-").isdigit():
        return int(value)
    return value


def _wire_layer(spec):
    spec = dict(spec)
    if "momentum_mode" in spec:
        code = momentum_mode_code(spec["momentum_mode"])
        spec["momentum_mode"] = _MODE_WIRE[code]
    return spec


def layer_spec(name, num_features, momentum_mode="torch", momentum=-1.0,
               track_running_stats=True, biased_running_var=False,
               initial_running_mean=(), initial_running_var=()):
    """The LayerSpec dict of one BN layer, resolved as the C++ client does.

    momentum < 0 takes the rule's default (0.1 torch, 0.9 decay); torch's
    momentum 0 becomes the equivalent decay rule (the wire reads 0 as "the
    default").
    """
    options = {
        "num_features": int(num_features),
        "momentum_mode": momentum_mode_code(momentum_mode),
        "momentum": float(momentum),
        "track_running_stats": bool(track_running_stats),
        "biased_running_var": bool(biased_running_var),
        "initial_running_mean": [float(v) for v in initial_running_mean],
        "initial_running_var": [float(v) for v in initial_running_var],
    }
    return json.loads(_syncnorm.layer_spec_json(options, name))


def _ranks(ranks, what):
    """A list of distinct ranks (ints >= 0) from an iterable; ValueError
    naming `what` otherwise."""
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
        raise ValueError("expected %s as a list of ranks, got %r"
                         % (what, ranks))
    out, seen = [], set()
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise ValueError("expected %s to be ranks (integers >= 0), got %r"
                             % (what, r))
        if r in seen:
            raise ValueError("rank %d is named twice in %s" % (r, what))
        seen.add(r)
        out.append(int(r))
    return out


def member_since(job_info, rank):
    """The first step of `rank`'s current time as a member of the job (a
    JobInfo dict): the step it joined at (0 for a member since the job was
    created); None when it is not among the latest members."""
    return _syncnorm.member_since(json.dumps(_wire_int64(job_info)),
                                  int(rank))


def _wire_int64(value, key=None):
    """A dict of _ints back with int64 fields as strings (proto3 JSON)."""
    if isinstance(value, dict):
        return {k: _wire_int64(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_wire_int64(v, key) for v in value]
    if key in _INT64_FIELDS and isinstance(value, int):
        return str(value)
    return value


def group_of(job_info, rank):
    """The group of `rank` in a JobInfo dict (explicit rank lists or blocks
    of group_size): the `group` of get_running_stats for that rank."""
    return _syncnorm.group_of(json.dumps(job_info), int(rank))


def _pem(value):
    """PEM text from None, PEM text (str or bytes) or a path."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        value = value.decode("ascii")
    if "-----BEGIN " in value:
        return value
    with open(value, encoding="ascii") as f:
        return f.read()


class Client:
    """A connection to the aggregator ("host:port"), or to its shards in
    ordinal order ("h0:port,h1:port,..." or
    "syncnorm-aggregator-{0..2}.syncnorm-aggregator.<ns>.svc:50051"), over
    which each job's layers are spread (see client/client.h). Thread-safe.

    rpc_timeout: seconds each admin call may take (it waits for the server
    to become reachable within it). round_timeout: seconds one forward or
    backward sync may take end to end, reconnects included; keep it above
    the job's round_timeout_ms so the server's DEADLINE_EXCEEDED naming the
    missing ranks arrives first. connect_timeout: seconds one connection
    attempt (TCP, TLS, HTTP/2 handshake) may take before it is given up
    and tried again; a server that accepts connections but does not answer
    holds rounds this long. Keep it above the slowest handshake the network
    may see.

    Credentials (docs/operations.md, "Security"): token, the bearer token sent on
    every call (rounds included); root_ca, the CA of the server's TLS
    certificate; client_cert and client_key, this client's certificate for
    mutual TLS. Each PEM is a path or the PEM text (str or bytes); any of
    them turns TLS on, as does tls=True (with the system's root CAs when
    root_ca is not given).

    relay: "host:port" of this rank's relay (docs/relay.md): its rounds go
    there, every layer's, and the relay sends them on to the shards; every
    other call goes to the shards at address. None: no relay.
    relay_fallback: when the relay is unreachable (its stream broke and no
    connection came up within connect_timeout), send the rounds to the
    shards as a client without a relay does, and go back to the relay at
    the first step of a later window of 8 steps that finds it up again
    (docs/relay.md, "A client's fallback"). False: the rounds wait for the
    relay until round_timeout. Default True: a relay holds no state, so a
    dead one should not stop a job the shards can serve.
    """

    def __init__(self, address="127.0.0.1:50051", rpc_timeout=30.0,
                 round_timeout=60.0, *, token=None, root_ca=None,
                 client_cert=None, client_key=None, tls=False,
                 connect_timeout=5.0, relay=None, relay_fallback=True):
        if (client_cert is None) != (client_key is None):
            raise ValueError("client_cert and client_key go together")
        self.rpc_timeout = float(rpc_timeout)
        self._raw = _syncnorm.Client(
            address, float(rpc_timeout), float(round_timeout),
            token=token or "", tls=bool(tls), root_ca=_pem(root_ca),
            client_cert=_pem(client_cert), client_key=_pem(client_key),
            connect_timeout_s=float(connect_timeout), relay=relay or "",
            relay_fallback=bool(relay_fallback))

    @property
    def address(self):
        return self._raw.address

    @property
    def relay(self):
        """The relay's address that rounds go to; None without one."""
        return self._raw.relay or None

    @property
    def relay_fallback(self):
        """Whether rounds go to the shards while the relay is unreachable."""
        return self._raw.relay_fallback

    @property
    def connect_timeout(self):
        """Seconds one connection attempt may take (as the client uses it)."""
        return self._raw.connect_timeout_s

    def create_job(self, job_id, world_size, layers, group_size=0,
                   round_timeout_ms=0, quorum=None, groups=None,
                   members=None, staleness=0, stats_health=True):
        """Creates the job (idempotent: the same spec again returns it).

        layers: LayerSpec dicts, e.g. from :func:`layer_spec`. group_size 0:
        one group of world_size ranks; k: ranks [g*k, (g+1)*k) form group g.
        groups: instead of group_size, the groups as rank lists (torch
        process groups), every rank in exactly one; group g is the g-th by
        lowest rank (see :func:`group_of`).
        quorum: None (every round waits for every rank of its group) or a
        QuorumPolicy dict {"min_ranks": k, "grace_ms": t}: grace_ms after a
        round's first contribution, with at least k ranks of the group
        present, the round completes without the others and its result
        names them (SyncBatchNorm.last_missing_ranks). members: the ranks
        that contribute from step 0 of an elastic job whose members change
        later (:meth:`update_membership`); world_size is then the rank
        space, every rank that may ever join is below it. None: every rank.
        staleness: the bound tau of a stale-synchronous job, 0 (default:
        synchronous) to 64. With tau > 0 a rank's forward of step s is
        answered once every member of its group has sent a step >= s - tau,
        with the merge of each member's latest forward within [s - tau, s]
        (the answer's view); the running statistics are still every step's
        full merge, in step order. Such a job takes no quorum and no
        per-round momentum or imported statistics. stats_health: False
        turns statistics health off (:meth:`stats_health`), for ranks that
        see differently distributed data by design.
        Returns the JobInfo dict. ServiceError ALREADY_EXISTS when the job
        exists with another spec.
        """
        if isinstance(staleness, bool) or not isinstance(staleness, int) \
                or staleness < 0:
            raise ValueError("expected staleness to be an integer >= 0 (0: "
                             "synchronous), got %r" % (staleness,))
        request = {
            "job_id": job_id,
            "world_size": int(world_size),
            "layers": [_wire_layer(s) for s in layers],
            "group_size": int(group_size),
            "round_timeout_ms": str(int(round_timeout_ms)),
        }
        if groups:
            request["groups"] = [{"ranks": [int(r) for r in g]}
                                 for g in groups]
        if members is not None:
            request["members"] = _ranks(members, "members")
            if not request["members"]:
                raise ValueError("expected at least one member, got none "
                                 "(members=None means every rank)")
        if staleness:
            request["staleness"] = staleness
        if not stats_health:
            request["disable_stats_health"] = True
        if quorum:
            request["quorum"] = {
                "min_ranks": int(quorum.get("min_ranks", 0)),
                "grace_ms": str(int(quorum.get("grace_ms", 0))),
            }
        return _ints(json.loads(
            self._raw.create_job_json(json.dumps(request))))

    def get_job(self, job_id):
        """The JobInfo dict (committed_step is -1 before any step)."""
        return _ints(json.loads(self._raw.get_job_json(job_id)))

    def delete_job(self, job_id):
        self._raw.delete_job(job_id)

    def stats_health(self, job_id):
        """The job's StatsHealth dict: "flags" (each with kind, layer,
        layer_name, group, rank, channel, first_step, last_step, score,
        active, cleared_step), "flags_in_force", "refused" (rank,
        nonfinite), "nonfinite_total", "rounds_scored", "enabled"."""
        return _ints(json.loads(self._raw.get_stats_health_json(job_id)))

    def get_running_stats(self, job_id, layers=None, checkpoint_step=0,
                          group=0):
        """The RunningStats dict: {"job_id", "step", "layers": [{"layer",
        "name", "num_batches_tracked", "running_mean", "running_var",
        "group"}]}. layers None: all."""
        request = {
            "job_id": job_id,
            "layers": [int(i) for i in (layers or [])],
            "checkpoint_step": str(int(checkpoint_step)),
            "group": int(group),
        }
        return _ints(json.loads(
            self._raw.get_running_stats_json(json.dumps(request))))

    def list_jobs(self):
        """JobInfo dicts of every job on the server, by job_id."""
        reply = json.loads(self._raw.list_jobs_json())
        return _ints(reply.get("jobs", []), "jobs")

    def set_running_stats(self, job_id, layers):
        """Replaces the running statistics of some (layer, group)s: layers
        are LayerStats dicts {"layer", "group", "running_mean",
        "running_var", "num_batches_tracked"[, "name"]}. Returns the
        RunningStats dict."""
        entries = []
        for entry in layers:
            entry = dict(entry)
            if "num_batches_tracked" in entry:
                entry["num_batches_tracked"] = str(int(
                    entry["num_batches_tracked"]))
            entries.append(entry)
        request = {"job_id": job_id, "layers": entries}
        return _ints(json.loads(
            self._raw.set_running_stats_json(json.dumps(request))))

    def checkpoint(self, job_id, step, tag="", timeout=None):
        """Waits (at most `timeout` seconds, default rpc_timeout) until
        `step` is committed by every layer of every group, then snapshots
        the job; returns the CheckpointInfo dict."""
        request = {"job_id": job_id, "step": str(int(step)), "tag": tag}
        return _ints(json.loads(self._raw.checkpoint_json(
            json.dumps(request),
            None if timeout is None else float(timeout))))

    def list_checkpoints(self, job_id):
        """CheckpointInfo dicts of the job, oldest first."""
        reply = json.loads(self._raw.list_checkpoints_json(job_id))
        return _ints(reply.get("checkpoints", []), "checkpoints")

    def restore(self, job_id, step):
        """Rolls the job back to its checkpoint of `step`; returns JobInfo."""
        request = {"job_id": job_id, "step": str(int(step))}
        return _ints(json.loads(
            self._raw.restore_checkpoint_json(json.dumps(request))))

    def update_membership(self, job_id, step=0, join=(), leave=(),
                          remove=()):
        """Changes which ranks of an elastic job contribute, from `step` on
        (0: the job's next step, one past the highest step any layer has
        completed). join: ranks that start at `step` from the service's
        running statistics; leave: ranks that take part in every round
        before `step` and none from it; remove: ranks that are gone (rounds
        before `step` still waiting for them complete without them). Each
        rank at most once. Idempotent. Returns the JobInfo dict, whose
        "membership" holds the members, version and history. ServiceError
        FAILED_PRECONDITION for a step already completed (the message names
        the next step); INVALID_ARGUMENT for a rank out of range or a change
        that leaves no member."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError("expected step to be an integer >= 0 (0: the "
                             "job's next step), got %r" % (step,))
        request = {"job_id": job_id, "step": str(step),
                   "join": _ranks(join, "join"),
                   "leave": _ranks(leave, "leave"),
                   "remove": _ranks(remove, "remove")}
        named = request["join"] + request["leave"] + request["remove"]
        seen = set()
        for r in named:
            if r in seen:
                raise ValueError("rank %d is named more than once over join, "
                                 "leave and remove" % r)
            seen.add(r)
        if not named:
            raise ValueError("expected ranks to join, leave or remove, got "
                             "none")
        return _ints(json.loads(
            self._raw.update_membership_json(json.dumps(request))))

    def node_group(self, job_id, rank):
        """The NodeGroup of a worker that is alone on its node (its own
        Reduce stream as contributor `rank`)."""
        return self._raw.solo_group(job_id, int(rank))

    def thread_node(self, job_id, rank, local_size, timeout=60.0):
        """A node of local_size threads of this process that merge their
        moments and send one contribution as `rank`; each thread takes its
        NodeGroup with .member(local_rank)."""
        return _syncnorm.ThreadNode(self._raw, job_id, int(rank),
                                    int(local_size), float(timeout))
