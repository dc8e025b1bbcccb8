"""Cancelling a job: the cancel mark in its meta hash and the cancel channel every worker
listens on, the records of the sub-agents that will not run (written in bulk), ending a job
whose every call must fail, and the check a sub-agent makes before each step (which also
ends a job whose deadline has passed)."""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from drover.workers.jobs._decode import text as _s
from drover.workers.jobs._stored import PAGE, compact_json
from drover.workers.jobs.archive import Archive
from drover.workers.jobs.claims import ClaimLost
from drover.workers.jobs.keys import JobKeys
from drover.workers.jobs.liveness import alive
from drover.workers.jobs.meta import ACTIVE, JobMeta
from drover.workers.jobs.records import Checkpoint, SubagentResult, Usage

__all__ = ["Cancels"]


class Cancels:
    def __init__(self, client: redis.Redis, keys: JobKeys, ttl_s: int, *, meta: JobMeta,
                 archive: Archive) -> None:
        self.r = client
        self.keys = keys
        self.ttl_s = ttl_s
        self.meta = meta
        self.archive = archive

    @property
    def channel(self) -> str:
        """The pub/sub channel a cancel is published on (the job's id), which workers hear."""
        return self.keys.cancel_channel

    def cancel(self, job_id: str, reason: str = "cancelled") -> bool:
        """Mark the job cancelled and tell every worker; False when it had already ended."""
        meta = self.meta.get(job_id)
        if meta.get("status") not in ACTIVE:
            return False
        pipe = self.r.pipeline()
        pipe.hsetnx(self.keys.job(job_id, "meta"), "cancelled", reason)
        pipe.publish(self.keys.cancel_channel, job_id)
        first, _ = pipe.execute()
        if first:  # the one cancel that counts writes the records (the others would repeat it)
            self.cancel_unstarted(job_id, reason)
        return True

    def cancel_unstarted(self, job_id: str, reason: str) -> int:
        """Record every sub-agent that is not running on a live worker as ``cancelled``, in
        bulk; returns how many.

        Their tasks may still be queued, waiting out a countdown, held by a worker that died,
        or not yet published at all (waiting in the window's line): a delivered one finds its
        record and ends at once, so a cancelled job of thousands ends in the time it takes to
        write the records, not to drain the queue. Left to write their own record with their
        usage: a sub-agent running on a live worker (the cancel aborts its call; one inside
        its first call has its send mark, ``before_send``, and its record counts that call as
        unanswered, or answered if the reply won the race), and one that a live worker holds
        in a countdown after calls it made (a checkpoint or a send mark: it ends at its
        countdown's end, without a call), and one whose call was sent and not answered (its
        send mark: if its worker died, the copy the sweep re-sends records it). A part whose
        worker is dead is recorded here with its checkpoint's usage; one held by a worker that
        dies later is recorded by the next pass (the fair-share pump repeats this for a
        cancelled job).
        """
        return self._record_unfinished(job_id, "cancelled", reason, "cancelled", None, False)

    def fail_unfinished(self, job_id: str, reason: str, *, error_type: str,
                        status_code: int | None = None, abort: bool = True) -> bool:
        """End the job now: every sub-agent without a record is recorded ``failed`` with this
        one reason (the fleet's only key was refused: no call of the job can succeed), calls
        in flight are aborted (the cancel channel) and the join says ``failed``. Sub-agents
        waiting for a retry are recorded with their checkpoint's usage. False when the job
        had already ended or this was done before.

        ``abort`` False (the provider's spend limit: the calls in flight were admitted before
        it and are paid for): the calls in flight are left to finish, and their sub-agents
        record themselves (an answer that ends one is ``ok``; its next call finds the job
        failed and ends ``failed`` with this reason without being sent)."""
        meta = self.meta.get(job_id)
        if meta.get("status") not in ACTIVE:
            return False
        why = json.dumps({"reason": reason, "type": error_type, "status": status_code})
        pipe = self.r.pipeline()
        pipe.hsetnx(self.keys.job(job_id, "meta"), "failed_all", why)
        pipe.hsetnx(self.keys.job(job_id, "meta"), "cancelled", reason)
        if abort:
            pipe.publish(self.keys.cancel_channel, job_id)
        first = pipe.execute()[0]
        if first:
            self._record_unfinished(job_id, "failed", reason, error_type, status_code, True,
                                    leave_running=not abort)
        return bool(first)

    def failed_all(self, job_id: str) -> dict[str, Any] | None:
        """What ``fail_unfinished`` recorded for the job (reason, type, status), if it ran."""
        raw = self.r.hget(self.keys.job(job_id, "meta"), "failed_all")
        return json.loads(raw) if raw else None

    def cancelled(self, job_id: str, fence: tuple[int | str, int] | None = None) -> str | None:
        """The cancel reason, when the job was cancelled or its deadline has passed.

        The first caller to see an expired deadline cancels the job (and so tells every
        worker): a deadline needs no process of its own watching it. With ``fence`` (a part
        and its claim token), the same round trip checks the claim: ``ClaimLost`` when
        another delivery holds it now.
        """
        pipe = self.r.pipeline(transaction=False)
        pipe.hmget(self.keys.job(job_id, "meta"), "cancelled", "deadline")
        pipe.time()
        if fence is not None:
            pipe.hget(self.keys.job(job_id, "claims"), str(fence[0]))
        (reason, deadline), (seconds, micros), *claim = pipe.execute()
        if fence is not None and (not claim[0] or int(_s(claim[0]).split("|", 1)[0]) != fence[1]):
            raise ClaimLost(f"{job_id}/{fence[0]}: claim {fence[1]} was superseded")
        if reason:
            return _s(reason)
        if deadline and seconds + micros / 1e6 >= float(deadline):
            self.cancel(job_id, "deadline")
            return _s(self.r.hget(self.keys.job(job_id, "meta"), "cancelled") or "deadline")
        return None

    def _record_unfinished(self, job_id: str, status: str, reason: str, error_type: str,
                           status_code: int | None, checkpointed: bool, *,
                           leave_running: bool = False) -> int:
        n = int(self.r.hget(self.keys.job(job_id, "meta"), "n") or 0)
        records, events = self.keys.job(job_id, "records"), self.keys.job(job_id, "events")
        claims = {_s(k): _s(v) for k, v in self.r.hgetall(self.keys.job(job_id, "claims")).items()}
        holders = {part: raw.split("|", 2)[1:] for part, raw in claims.items()
                   if raw.count("|") == 2 and raw.split("|", 2)[1] in ("running", "held")}
        workers = sorted({w for _, w in holders.values() if w})
        living = alive(self.r, self.keys.prefix, workers) if workers else {}
        running = {int(p) for p, (state, w) in holders.items()
                   if p.isdigit() and state == "running" and living.get(w)}
        held = {int(p) for p, (state, w) in holders.items()
                if p.isdigit() and state == "held" and living.get(w)}
        written = 0
        for start in range(0, n, PAGE):
            indexes = range(start, min(n, start + PAGE))
            pipe = self.r.pipeline(transaction=False)
            for index in indexes:
                pipe.hexists(records, str(index))
                pipe.get(self.keys.job(job_id, "ckpt", index))
                pipe.hexists(self.keys.job(job_id, "sent"), str(index))
            flags = pipe.execute()
            # A sub-agent with a send marked records itself (its unanswered call counts; if
            # its worker died, its re-sent copy does). A cancel leaves to themselves the ones
            # a live worker runs, or holds in a countdown after calls it made; the rest, those
            # of dead workers too, are recorded here (with their checkpoint's usage).
            # ``leave_running``: a sub-agent running on a live worker records itself too.
            todo = {i: flags[3 * k + 1] for k, i in enumerate(indexes)
                    if not flags[3 * k] and not flags[3 * k + 2]
                    and not (leave_running and i in running)
                    and (checkpointed or not (i in running or (i in held and flags[3 * k + 1])))}
            if not checkpointed:
                # A turn waiting in a Message Batch: the sub-agent records itself when its
                # batch ends (the cancel reaches the provider too), since a request that
                # succeeded before that is billed, at the batch rate, and its usage belongs
                # in the record.
                todo = {i: ckpt for i, ckpt in todo.items()
                        if not (ckpt and Checkpoint.model_validate_json(ckpt).batch_cid)}
            if not todo:
                continue
            now = time.time()
            raws = {}
            for i, ckpt in todo.items():
                state = Checkpoint.model_validate_json(ckpt) if ckpt else None
                raws[i] = compact_json(SubagentResult(
                    job_id=job_id, index=i, status=status,  # type: ignore[arg-type]
                    attempts=0 if state is None else state.failures,
                    usage=state.usage if state is not None else Usage(),
                    turns=state.turns if state is not None else 0, error=reason,
                    error_type=error_type, status_code=status_code, finished_at=now))
            pipe = self.r.pipeline(transaction=False)
            for index, raw in raws.items():
                pipe.hsetnx(records, str(index), raw)
            firsts = [i for i, first in zip(raws, pipe.execute(), strict=True) if first]
            self.archive.keep([(SubagentResult.model_validate_json(raws[i]), None) for i in firsts])
            if not firsts:
                continue
            pipe = self.r.pipeline(transaction=False)
            for index in firsts:
                pipe.xadd(events, {"i": index, "s": status})
            pipe.hincrby(self.keys.job(job_id, "counts"), status, len(firsts))
            for key in (records, events, self.keys.job(job_id, "counts")):
                pipe.expire(key, self.ttl_s)
            pipe.execute()
            written += len(firsts)
        return written
