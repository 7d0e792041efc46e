"""Uneven inputs: a Session as a torch.distributed.algorithms.join Joinable.

torch's Join shadows the collectives of ranks that still train for ranks
that have run out of data. Its documentation excludes collectives in the
forward pass (torch.nn.SyncBatchNorm hangs); syncnorm's rounds are not
collectives but rounds of a job whose members change at step boundaries,
so a rank that runs out leaves the job from its next step and the rounds
of the others complete without it; when every rank has run out, all
rejoin at one step and load the service's statistics.
"""

import sys

import torch

from .._client import ServiceError

try:  # torch built without torch.distributed has no Join
    from torch.distributed.algorithms.join import Join, Joinable, JoinHook
except ImportError:  # pragma: no cover
    Join = None
    Joinable = object
    JoinHook = object


class SessionJoinHook(JoinHook):
    """The session's part of Join on a rank that has run out of data: the
    rank is absent from the job from its next step (main_hook, if the
    Join's count did not already make it so), and once every rank has
    joined, every rank rejoins (post_hook)."""

    def __init__(self, session):
        self.session = session

    def main_hook(self):
        leave(self.session)

    def post_hook(self, is_last_joiner):
        rejoin(self.session)


def hook(session):
    """The Session's JoinHook, for the Join context being entered. Join
    runs the hooks of its joinables in order once per shadowed iteration,
    and DDP's blocks until the ranks still training finish their backward,
    whose forward rounds would wait for this rank: so the rank leaves
    right after Join's first count of the ranks still training (which
    precedes every hook, and pairs with their notification at the start of
    their next forward), when there are any. Until the context ends,
    every forward of the attached model tells Join that this rank trains
    (which it heeds when the session is its first joinable, as without
    DDP)."""
    _stop_notices(session)
    if session._model is not None:
        session._join_notice = session._model.register_forward_pre_hook(
            _ForwardNotice(session))
    join = _enclosing_join()
    count = getattr(join, "_get_num_nonjoined_procs", None)
    if count is not None:

        def count_then_absent():
            training = count()
            if training:  # at the end of an even epoch nobody waits
                leave(session)
            return training

        join._get_num_nonjoined_procs = count_then_absent
    return SessionJoinHook(session)


def _enclosing_join():
    """The torch Join whose constructor asks for this hook, or None (then
    the rank leaves in main_hook, in time only where the session is the
    first joinable)."""
    if Join is None:
        return None
    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Join):
            return candidate
        frame = frame.f_back
    return None


class _ForwardNotice:
    """A forward pre-hook of the attached model: tells the Join context,
    when the session is its first joinable, that this rank has not joined,
    as DDP does at every forward of the model it wraps. Pickles and copies
    as a no-op (a reloaded model is attached again)."""

    def __init__(self, session):
        self.session = session

    def __call__(self, module, inputs):
        if self.session is not None and Join is not None:
            Join.notify_join_context(self.session)

    def __getstate__(self):
        return {"session": None}


def _stop_notices(session):
    if session._join_notice is not None:
        session._join_notice.remove()
        session._join_notice = None


def leave(session):
    """Makes this rank absent from the job from its layers' next step, once
    per Join: rounds of that step and later complete without it, also those
    already waiting. Where another group of the job has run past that step
    (groups' steps do not move together), the rank is removed instead: its
    group's rounds still waiting for it complete without it, and name it in
    their missing ranks."""
    if session._join_left is not None:
        return
    step = max(session.steps())
    try:
        session.client.update_membership(session.job_id, step=step,
                                         leave=[session.rank])
    except ServiceError as e:
        if e.code != "FAILED_PRECONDITION":
            raise
        session.client.update_membership(session.job_id,
                                         remove=[session.rank])
    session._join_left = step


def rejoin(session):
    """After every rank of the Join's process group has run out: the ranks
    that left rejoin at one step, the first after the longest rank's last
    (one rank asks, then every rank waits for it), and every rank's layers
    continue there with the service's statistics in their buffers (DDP's
    post-hook copied the last joiner's buffers to every rank, across
    groups)."""
    dist = torch.distributed
    group = session.join_process_group
    mine = (session.rank, max(session.steps()), session._join_left)
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    step = max(s for _, s, _ in everyone)
    left = sorted(r for r, _, at in everyone if at is not None)
    if left and dist.get_rank(group) == 0:
        session.client.update_membership(session.job_id, step=step,
                                         join=left)
    dist.barrier(group=group)
    for bn in session.layers:
        bn._sn_step = step
    session._join_left = None
    _stop_notices(session)
    session.pull_running_stats()
