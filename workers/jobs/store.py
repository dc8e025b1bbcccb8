"""A job's state in Redis: the spec, the subtasks, checkpoints, records and the event stream.

Task messages carry ids only; everything a sub-agent needs (its prompt, its conversation so
far) is read from here, so prompts never travel through the broker or show up in Flower.
Every key of a job starts with ``{prefix}:job:{id}:`` and expires with the job's records.

The store is synchronous: the orchestrator and the CLI call it directly, and the worker's
event loop calls it through ``asyncio.to_thread`` (a Redis round trip is short, and keeping
one implementation beats keeping a sync and an async copy in step).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis

from drover.errors import JobNotFound
from drover.workers.jobs._decode import text as _s
from drover.workers.jobs._stored import (
    PAGE,
    compact_json,
    execute_loaded,
    unpack_final,
)
from drover.workers.jobs.archive import Archive
from drover.workers.jobs.claims import LUA, ClaimLost, Claims
from drover.workers.jobs.counters import Counters
from drover.workers.jobs.keys import JobKeys
from drover.workers.jobs.liveness import alive
from drover.workers.jobs.meta import ACTIVE, JobMeta
from drover.workers.jobs.outcomes import Outcomes
from drover.workers.jobs.record_store import Records
from drover.workers.jobs.records import (
    Checkpoint,
    SubagentResult,
    Usage,
)
from drover.workers.jobs.results_db import ResultsStore
from drover.workers.jobs.spec import JobSpec
from drover.workers.jobs.specs import Specs
from drover.workers.jobs.spending import Spending
from drover.workers.jobs.stream import Stream


@dataclass
class SubagentStart:
    """A sub-agent's starting point: its record if it already finished, else what it needs."""

    record: SubagentResult | None = None
    spec: JobSpec | None = None
    checkpoint: Checkpoint | None = None
    task: str | None = None
    deadline_in: float | None = None  # seconds until the job's deadline, on Redis's clock
    token: int = 0  # the claim this delivery took (see claims.py); 0 when it took none
    stale: bool = False  # another delivery holds the claim: stop before any call
    sent: dict[str, Any] | None = None  # the last send's mark (before_send), if any




class JobStore:
    def __init__(self, client: redis.Redis, *, prefix: str = "drover", ttl_s: int = 604800,
                 results: ResultsStore | None = None):
        self.r = client
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.keys = JobKeys(prefix)
        # The durable results store (DROVER_RESULTS_URL), or None: records and finished jobs
        # are copied there, and a job Redis no longer has is read from there.
        self.archive = Archive(client, self.keys, results)
        self.counters = Counters(client, self.keys, ttl_s)
        self.spending = Spending(client, self.keys, ttl_s)
        self.stream = Stream(client, self.keys)
        self.specs = Specs(client, self.keys, ttl_s, self.archive)
        self.meta = JobMeta(client, self.keys, self.archive)
        self.records = Records(client, self.keys, ttl_s, self.archive)
        self.outcomes = Outcomes(client, self.keys, ttl_s, archive=self.archive,
                                 records=self.records, specs=self.specs, meta=self.meta)
        self.claims = Claims(client, prefix, ttl_s)
        self._send = client.register_script((LUA / "send.lua").read_text())

    def key(self, job_id: str, *parts: object) -> str:
        return self.keys.job(job_id, *parts)

    @property
    def cancel_channel(self) -> str:
        return self.keys.cancel_channel

    # --- cancellation -------------------------------------------------------------------
    def cancel(self, job_id: str, reason: str = "cancelled") -> bool:
        """Mark the job cancelled and tell every worker; False when it had already ended."""
        meta = self.meta.get(job_id)
        if meta.get("status") not in ACTIVE:
            return False
        pipe = self.r.pipeline()
        pipe.hsetnx(self.key(job_id, "meta"), "cancelled", reason)
        pipe.publish(self.cancel_channel, job_id)
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
                        status_code: int | None = None) -> bool:
        """End the job now: every sub-agent without a record is recorded ``failed`` with this
        one reason (the fleet's only key was refused: no call of the job can succeed), calls
        in flight are aborted (the cancel channel) and the join says ``failed``. Sub-agents
        waiting for a retry are recorded with their checkpoint's usage. False when the job
        had already ended or this was done before."""
        meta = self.meta.get(job_id)
        if meta.get("status") not in ACTIVE:
            return False
        why = json.dumps({"reason": reason, "type": error_type, "status": status_code})
        pipe = self.r.pipeline()
        pipe.hsetnx(self.key(job_id, "meta"), "failed_all", why)
        pipe.hsetnx(self.key(job_id, "meta"), "cancelled", reason)
        pipe.publish(self.cancel_channel, job_id)
        first, _, _ = pipe.execute()
        if first:
            self._record_unfinished(job_id, "failed", reason, error_type, status_code, True)
        return bool(first)

    def failed_all(self, job_id: str) -> dict[str, Any] | None:
        """What ``fail_unfinished`` recorded for the job (reason, type, status), if it ran."""
        raw = self.r.hget(self.key(job_id, "meta"), "failed_all")
        return json.loads(raw) if raw else None

    def _record_unfinished(self, job_id: str, status: str, reason: str, error_type: str,
                           status_code: int | None, checkpointed: bool) -> int:
        n = int(self.r.hget(self.key(job_id, "meta"), "n") or 0)
        records, events = self.key(job_id, "records"), self.key(job_id, "events")
        claims = {_s(k): _s(v) for k, v in self.r.hgetall(self.key(job_id, "claims")).items()}
        holders = {part: raw.split("|", 2)[1:] for part, raw in claims.items()
                   if raw.count("|") == 2 and raw.split("|", 2)[1] in ("running", "held")}
        workers = sorted({w for _, w in holders.values() if w})
        living = alive(self.r, self.prefix, workers) if workers else {}
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
                pipe.get(self.key(job_id, "ckpt", index))
                pipe.hexists(self.key(job_id, "sent"), str(index))
            flags = pipe.execute()
            # A sub-agent with a send marked records itself (its unanswered call counts; if
            # its worker died, its re-sent copy does). A cancel leaves to themselves the ones
            # a live worker runs, or holds in a countdown after calls it made; the rest, those
            # of dead workers too, are recorded here (with their checkpoint's usage).
            todo = {i: flags[3 * k + 1] for k, i in enumerate(indexes)
                    if not flags[3 * k] and not flags[3 * k + 2]
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
            pipe.hincrby(self.key(job_id, "counts"), status, len(firsts))
            for key in (records, events, self.key(job_id, "counts")):
                pipe.expire(key, self.ttl_s)
            pipe.execute()
            written += len(firsts)
        return written

    def cancelled(self, job_id: str, fence: tuple[int | str, int] | None = None) -> str | None:
        """The cancel reason, when the job was cancelled or its deadline has passed.

        The first caller to see an expired deadline cancels the job (and so tells every
        worker): a deadline needs no process of its own watching it. With ``fence`` (a part
        and its claim token), the same round trip checks the claim: ``ClaimLost`` when
        another delivery holds it now.
        """
        pipe = self.r.pipeline(transaction=False)
        pipe.hmget(self.key(job_id, "meta"), "cancelled", "deadline")
        pipe.time()
        if fence is not None:
            pipe.hget(self.key(job_id, "claims"), str(fence[0]))
        (reason, deadline), (seconds, micros), *claim = pipe.execute()
        if fence is not None and (not claim[0] or int(_s(claim[0]).split("|", 1)[0]) != fence[1]):
            raise ClaimLost(f"{job_id}/{fence[0]}: claim {fence[1]} was superseded")
        if reason:
            return _s(reason)
        if deadline and seconds + micros / 1e6 >= float(deadline):
            self.cancel(job_id, "deadline")
            return _s(self.r.hget(self.key(job_id, "meta"), "cancelled") or "deadline")
        return None

    # --- per sub-agent state ------------------------------------------------------------
    def start(self, job_id: str, index: int, *, worker: str | None = None,
              token: int = 0) -> SubagentStart:
        """Everything a sub-agent needs to start or resume, in one round trip.

        With ``worker``, the same round trip takes the sub-agent's claim for that worker,
        if ``token`` (the message's) is the current one; else the start comes back ``stale``.
        """
        def queued() -> redis.client.Pipeline:
            pipe = self.r.pipeline(transaction=False)
            if worker is not None:
                self.claims.start(job_id, index, token, worker, client=pipe)
            pipe.hget(self.key(job_id, "records"), str(index))
            pipe.get(self.key(job_id, "spec"))
            pipe.get(self.key(job_id, "ckpt", index))
            pipe.lindex(self.key(job_id, "tasks"), index)
            pipe.hget(self.key(job_id, "meta"), "deadline")
            pipe.time()
            pipe.hget(self.key(job_id, "sent"), str(index))
            return pipe

        replies = execute_loaded(queued)
        claimed = int(replies.pop(0)) if worker is not None else 0
        record, spec, checkpoint, task, deadline, (seconds, micros), sent = replies
        if record is not None:
            return SubagentStart(record=SubagentResult.model_validate_json(record))
        if claimed < 0:
            return SubagentStart(stale=True)
        if spec is None:
            raise JobNotFound(f"no job {job_id!r} in Redis (wrong id, or its records expired)")
        if checkpoint is None and task is None:
            raise JobNotFound(f"job {job_id!r} has no subtask {index}")
        return SubagentStart(
            spec=JobSpec.model_construct(**json.loads(spec)),  # validated at submit
            checkpoint=Checkpoint.model_validate_json(checkpoint) if checkpoint else None,
            task=_s(task) if task is not None else None,
            deadline_in=float(deadline) - (seconds + micros / 1e6) if deadline else None,
            token=claimed, sent=json.loads(sent) if sent else None)

    def before_send(self, job_id: str, index: int, token: int, mark: dict[str, Any]
                    ) -> str | None:
        """Right before a sub-agent's call goes out: ``ClaimLost`` when another delivery holds
        it, the reason when its job was cancelled (or its deadline passed: that cancels the
        job), else None once ``mark`` is stored as the sub-agent's last send (lua/send.lua)."""
        reply = self._send(keys=[self.key(job_id, "claims"), self.key(job_id, "meta"),
                                 self.key(job_id, "sent")],
                           args=[str(index), token, json.dumps(mark), self.ttl_s])
        code = int(reply[0])
        if code < 0:
            raise ClaimLost(f"{job_id}/{index}: claim {token} was superseded")
        if code == 1:
            return None
        if len(reply) > 2:  # the deadline passed: the first to see it cancels the job
            self.cancel(job_id, "deadline")
            return _s(self.r.hget(self.key(job_id, "meta"), "cancelled") or "deadline")
        return _s(reply[1])

    def load_checkpoint(self, job_id: str, index: int) -> Checkpoint | None:
        """The running checkpoint, or once the sub-agent finished its final state."""
        raw = self.r.get(self.key(job_id, "ckpt", index))
        if raw is not None:
            return Checkpoint.model_validate_json(raw)
        raw = self.r.hget(self.key(job_id, "final"), str(index))
        return unpack_final(raw) if raw else None

    def save_checkpoint(self, job_id: str, index: int, state: Checkpoint,
                        token: int = 0) -> None:
        """Store the checkpoint; with a claim ``token``, only while it is the claim."""
        if token:
            self.claims.set_fenced(job_id, index, token, self.key(job_id, "ckpt", index),
                                   state.model_dump_json())
            return
        self.r.set(self.key(job_id, "ckpt", index), state.model_dump_json(), ex=self.ttl_s)

    def tool_results(self, job_id: str, index: int) -> dict[str, dict[str, Any]]:
        raw = self.r.hgetall(self.key(job_id, "tools", index))
        return {_s(k): json.loads(v) for k, v in raw.items()}

    def save_tool_result(self, job_id: str, index: int, tool_use_id: str,
                         result: dict[str, Any], token: int = 0) -> None:
        key = self.key(job_id, "tools", index)
        if token:
            self.claims.hset_fenced(job_id, index, token, key, tool_use_id, json.dumps(result))
            return
        pipe = self.r.pipeline()
        pipe.hset(key, tool_use_id, json.dumps(result))
        pipe.expire(key, self.ttl_s)
        pipe.execute()
