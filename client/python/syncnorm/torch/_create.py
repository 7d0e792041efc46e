"""Creating a model's job: the statistics it starts from and what an
existing job with another spec differs in."""

import torch

from .._client import ServiceError


def take_rank0_buffers(dist, layers):
    """Every rank's running-statistics buffers become rank 0's, as DDP
    broadcasts rank 0's buffers at construction: a collective over the
    default group, every rank calls it. A checkpoint loaded on rank 0 alone
    is then the job's start on every rank. Layers whose buffers do not
    match rank 0's in shape keep their own (the spec check names them)."""
    mine = [_buffers(bn) for bn in layers]
    payload = [mine if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(payload, src=0)
    if dist.get_rank() == 0:
        return
    with torch.no_grad():
        for bn, theirs in zip(layers, payload[0]):
            ours = _buffers(bn)
            if theirs is None or ours is None or \
                    theirs[0].shape != ours[0].shape:
                continue
            bn.running_mean.copy_(theirs[0])
            bn.running_var.copy_(theirs[1])
            bn.num_batches_tracked.fill_(int(theirs[2]))


def _buffers(bn):
    if not bn.track_running_stats or bn.running_mean is None:
        return None
    return (bn.running_mean.detach().cpu().clone(),
            bn.running_var.detach().cpu().clone(),
            int(bn.num_batches_tracked))


def create_job(client, job_id, world_size, specs, decided, **kw):
    """(JobInfo, whether the job's statistics replace the buffers): the job
    created, or the existing one. An existing job whose spec differs only in
    the initial running statistics of layers that have not trained is taken
    as it is when every rank is known to attach with the same statistics
    (`decided`: they took rank 0's); otherwise ServiceError ALREADY_EXISTS
    saying what differs and what to do."""
    try:
        return client.create_job(job_id, world_size, specs, **kw), False
    except ServiceError as e:
        if e.code != "ALREADY_EXISTS":
            raise
        first = e
    info = client.get_job(job_id)
    differences = spec_differences(info, world_size, specs, kw)
    if differences:
        raise ServiceError(
            "ALREADY_EXISTS: job %r exists with another spec: %s. Attach the "
            "model and options the job was created with, or pass another "
            "job_id (or delete the job if it is no longer needed)"
            % (job_id, "; ".join(differences)), "ALREADY_EXISTS") from first
    statistics = initial_differences(info, specs)
    if not statistics:
        raise ServiceError(
            "ALREADY_EXISTS: job %r exists with another quorum, members or "
            "round timeout than this rank asks for (see Client.get_job). "
            "Pass the options the job was created with, or another job_id"
            % job_id, "ALREADY_EXISTS") from first
    if decided:
        # Every rank asks for rank 0's statistics, so the job that differs
        # was created before this run and has not trained: it wins.
        return info, True
    raise ServiceError(
        "ALREADY_EXISTS: job %r has not trained yet and starts from other "
        "running statistics than this rank's in %s: the ranks attached with "
        "different running statistics (a checkpoint loaded on some ranks "
        "only?). Load the same statistics on every rank, or call "
        "torch.distributed.init_process_group before attach (every rank then "
        "starts from rank 0's, as DDP does); a job meant to start from these "
        "statistics needs another job_id or the old job deleted"
        % (job_id, ", ".join(statistics)), "ALREADY_EXISTS") from first


def spec_differences(info, world_size, specs, kw):
    """What the existing job (a JobInfo dict) and the requested spec differ
    in, as phrases, the initial running statistics aside."""
    out = []
    if info["world_size"] != world_size:
        out.append("world_size %d there, %d here" % (info["world_size"],
                                                     world_size))
    theirs = info.get("layers", [])
    if len(theirs) != len(specs):
        out.append("%d SyncBatchNorm layers there, %d in this model"
                   % (len(theirs), len(specs)))
    fields = (("name", "name"), ("num_features", "channels"),
              ("momentum_mode", "momentum mode"), ("momentum", "momentum"),
              ("biased_running_var", "biased_running_var"),
              ("no_running_stats", "no_running_stats"))
    for index, (t, o) in enumerate(zip(theirs, specs)):
        for key, word in fields:
            if t.get(key) != o.get(key):
                out.append("layer %d %r has %s %r there, %r here"
                           % (index, o.get("name"), word, t.get(key),
                              o.get(key)))
    if out:
        return out
    group_size = kw.get("group_size") or 0
    groups = [list(g) for g in (kw.get("groups") or [])]
    there = [list(g["ranks"]) for g in info.get("groups") or []]
    if groups != there or (not groups and (group_size or world_size) !=
                           (info.get("group_size") or world_size)):
        out.append("its groups are %s there, %s here" % (
            there or "blocks of %d" % (info.get("group_size") or world_size),
            groups or "blocks of %d" % (group_size or world_size)))
    if int(info.get("staleness", 0)) != int(kw.get("staleness") or 0):
        out.append("staleness %s there, %s here" % (
            info.get("staleness", 0), kw.get("staleness") or 0))
    off_there = bool(info.get("disable_stats_health", False))
    off_here = not kw.get("stats_health", True)
    if off_there != off_here:
        out.append("statistics health %s there, %s here" % (
            "off" if off_there else "on", "off" if off_here else "on"))
    return out


def initial_differences(info, specs):
    """The layers whose initial running statistics differ between the job
    and the requested spec, as "layer 'name' (running_mean)"."""
    out = []
    for t, o in zip(info.get("layers", []), specs):
        channels = int(o["num_features"])
        which = [key[len("initial_"):] for key, default in (
            ("initial_running_mean", 0.0), ("initial_running_var", 1.0))
            if [float(v) for v in t.get(key) or [default] * channels] !=
            [float(v) for v in o.get(key) or [default] * channels]]
        if which:
            out.append("layer %r (%s)" % (o["name"], ", ".join(which)))
    return out
