"""Recovery: the parts of running jobs that a dead worker held are sent again within seconds.

Every ``celery worker`` process runs a sweep in a thread; one worker at a time does the work
(a Redis lock), every ``DROVER_HEARTBEAT_S``:

1. **Dead workers.** A worker whose heartbeat key has expired (liveness.py) is dead. Each part
   it held or ran (claims.py: sub-agents, a join, a planning task; running, prefetched or
   waiting out a retry countdown) is taken over with a new fencing token and sent again to
   its job's queue. It resumes from its checkpoint on another worker; the dead worker's own
   copy of the message, should the broker ever hand it out again, is stale and stops before
   any call. The cost grows with the number of workers and what the dead ones held, never
   with the length of a queue or the number of jobs.
   On the Redis broker a worker killed after kombu recorded a message as unacked but before
   drover recorded its receipt leaves that message unacked (for the visibility timeout) with
   its claim still "sent"; so does a live worker's consumer that took a message while Redis
   was going away (the receipt's write failed) and dropped it when it reconnected. For a
   minute after a worker died or a heartbeat got Redis back, the sweep also looks at the
   broker's unacked messages (what workers hold, not the queue) for such orphans and
   re-sends them.
2. **Joins.** A re-sent sub-agent is outside its job's chord, which may then never count to
   the end (on Redis the dead worker's copy stays unacked for the visibility timeout): once
   every record of such a job is in and it has no result, its join is sent.
3. **Messages the broker lost, state a failover lost** (only for a job that gained no
   record for ``DROVER_RESEND_AFTER_S``). On either broker such a job with every record in and
   no result gets its join: a failover can lose the chord's count, or fail the chord (a
   header task whose count met a dead master fails it, and Celery never sends its body).
   Celery's Redis transport takes a message off the queue (BRPOP) before it records it as
   unacked, so a worker killed between the two loses it for good (celery#4354, celery#7950,
   kombu#305), before drover saw it. Such a job's unfinished sub-agents that no worker holds
   and that the broker no longer has (read with kombu's Redis layout:
   ``{prefix}:celery:{queue}`` lists and the ``unacked`` hash) are sent again, whatever their
   claim says (with a new token: a delivery that still runs one stops at its next write);
   this is the only step whose cost grows with the queue, and it runs only for a stalled job.
   A dying worker can hit that gap too (a message popped whose reply it never read), so for a
   minute after a worker death, or after a worker's heartbeat lost Redis and got it back (a
   restart, a failover, connections that went silent: a BRPOP's reply lost on one), a job
   counts as stalled after ``DROVER_HEARTBEAT_TTL_S`` without a record. RabbitMQ keeps
   unacked messages on the server: no such gap; but a Redis failover can lose what a
   delivery wrote (its receipt, start and record) after RabbitMQ has its ack, so there a
   stalled job's unfinished sub-agents that no live worker holds or runs are sent again (a
   copy still queued is then stale and stops before any call).

4. **The window against the truth** (every job in the queue's fair-share window, each pass).
   A part whose claim names a dead worker (held or running) is taken over and sent again even
   when it is missing from that worker's list (a lost update: whatever the cause, it heals
   within one pass), and a sub-agent counted as waiting out a countdown that has a record,
   runs, or belonged to a dead worker hands its place back (``FairShare.undefer``). Each
   repair is logged and counted (``{prefix}:recovery:repairs``, the metric
   ``drover_window_repairs_total``). A job with sub-agents out, no record for
   ``stall_after_s`` and no live worker holding any of its parts is *stalled*: logged once,
   listed in ``{prefix}:stalled`` (``drover jobs``, ``drover watch`` and the metric
   ``drover_jobs_stalled`` show it) until its next record, and repaired by the same step.
   A job with sub-agents out that no live worker holds or runs gets step 3's look for lost
   messages after a heartbeat TTL without a record, whoever noticed what: a connection that
   went silent can take a popped message with it, and the heartbeats that would mark that
   gap may not have been on a silenced connection. On RabbitMQ too: three sub-agents of a
   job whose connections went silent were never received and no record came for 32 s (CI
   of 8a70ee9, test_silent_connections[rabbitmq]); RabbitMQ's queue cannot be read, so each
   one no live worker holds or runs is sent again (a queued copy is then stale).

5. **Results the store missed** (with ``DROVER_RESULTS_URL``, at most every
   ``RESULTS_RETRY_S``): a job that ended while the results store did not answer is listed
   (``{prefix}:results:pending``) and copied there, records, spec and result, once it answers
   (while Redis still has the job: its TTL, a week by default).

A sub-agent whose worker died while running it ``DROVER_MAX_ATTEMPTS`` times gets a ``failed``
record instead, so a task that kills every worker it lands on cannot keep a job open. Only
that counts: a part a dead worker merely held (prefetched, waiting out a countdown), a worker
that stopped beating because its broker connection was stuck (liveness.py), and a message the
broker lost are the broker's faults, and are sent again for as long as it takes.
"""

from __future__ import annotations

import base64
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import redis

from drover.config import Settings, get_settings
from drover.workers.fairshare import FairShare
from drover.workers.jobs import reply_text as _s
from drover.workers.jobs.archive import RESULTS_RETRY_S
from drover.workers.jobs.keys import JobKeys
from drover.workers.jobs.liveness import (
    alive,
    forget_worker,
    mark_message_gap,
    registered_workers,
    stuck_on_its_broker,
)
from drover.workers.jobs.meta import ACTIVE
from drover.workers.jobs.records import SubagentResult
from drover.workers.jobs.store import JobStore

__all__ = ["Part", "Schedulers", "Send", "repair_windows", "stall_after_s", "stalled_jobs",
           "start_sweeper", "subagent_of", "subagents_in_broker", "sweep",
           "take_over_dead_workers", "window_repairs"]

log = logging.getLogger(__name__)

SUBAGENT_TASK = "drover.run_subagent"
KOMBU_SEP = "\x06\x16"  # kombu's separator between a queue name and its priority step
KOMBU_PRIORITY_STEPS = (3, 6, 9)  # step 0 is the plain queue
RECENT_JOBS = 200  # the stalled-job scan looks at this many of the newest jobs

Part = int | str  # a sub-agent's index, "join" or "plan"
# Puts a part on the broker again: (queue, job id, part, claim token the message carries).
Send = Callable[[str, str, Part, int], None]
# The fair-share scheduler of a queue, from the process's root (``Services.fairshare``): the
# sweep asks it for each job's queue, so it builds no scheduler (nor client) of its own.
Schedulers = Callable[[str], FairShare]


def sweep_interval_s(settings: Settings) -> float:
    return settings.heartbeat_s


def scan_interval_s(settings: Settings) -> float:
    """How often the stalled-job scan (step 3) runs, fleet-wide."""
    return max(1.0, min(30.0, settings.resend_after_s / 4))


def subagent_of(message: dict[str, Any]) -> tuple[str, int] | None:
    """(job id, index) of a ``run_subagent`` message in kombu's JSON envelope, else None."""
    if (message.get("headers") or {}).get("task") != SUBAGENT_TASK:
        return None
    body = message.get("body")
    if not isinstance(body, str | bytes):
        return None
    if (message.get("properties") or {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args = json.loads(body)[0]  # Celery's message protocol 2: [args, kwargs, embed]
    return str(args[0]), int(args[1])


def subagents_in_broker(r: redis.Redis, key_prefix: str, queue: str) -> set[tuple[str, int]]:
    """Every sub-agent task the Redis broker still holds for ``queue``: queued or unacked."""
    base = f"{key_prefix}:celery:"
    raws: list[Any] = []
    for key in [queue, *(f"{queue}{KOMBU_SEP}{step}" for step in KOMBU_PRIORITY_STEPS)]:
        raws.extend(json.loads(raw) for raw in r.lrange(base + key, 0, -1))
    for raw in r.hvals(base + "unacked"):  # [message, exchange, routing key]: this queue's
        entry = json.loads(raw)
        if len(entry) < 3 or entry[2] in (queue, None, ""):
            raws.append(entry[0])
    found = set()
    for message in raws:
        try:
            subagent = subagent_of(message)
        except (ValueError, TypeError, KeyError, IndexError):
            continue  # not a message of ours
        if subagent is not None:
            found.add(subagent)
    return found


def sweep(store: JobStore, settings: Settings, send: Send, schedulers: Schedulers
          ) -> list[tuple[str, Part]]:
    """One pass (if no other worker made one a moment ago); returns what was sent again."""
    r = store.r
    if not r.set(store.keys.recovery("lock"), "1", nx=True,
                 px=int(sweep_interval_s(settings) * 900)):
        return []
    dead: list[str] = []
    sent = take_over_dead_workers(store, settings, send, schedulers, dead)
    if dead and not settings.broker_is_rabbitmq:
        # A dying worker may also have taken a message off the queue whose reply it never
        # read (the BRPOP gap): for a while, a job that stalls is looked at after a heartbeat
        # TTL instead of DROVER_RESEND_AFTER_S.
        mark_message_gap(r, store.prefix, settings)
    after_a_death = bool(r.exists(store.keys.recovery("death")))
    if after_a_death and not settings.broker_is_rabbitmq:
        # Not only a dead worker's: a consumer that reconnected after Redis was away drops
        # what it had prefetched, which stays unacked (kombu hands it out again only after
        # the visibility timeout), its receipt unrecorded if Redis was away when it came.
        sent += resend_orphans(store, settings, send, schedulers)
    sent += join_recovered_jobs(store, send)
    every = sweep_interval_s(settings) if after_a_death else scan_interval_s(settings)
    if r.set(store.keys.recovery("scan"), "1", nx=True, px=int(every * 900)):
        sent += resend_lost_messages(store, settings, send, schedulers, min(
            settings.resend_after_s, settings.heartbeat_ttl_s) if after_a_death else None)
    try:
        sent += repair_windows(store, settings, send, schedulers)
    except redis.RedisError as error:  # the other steps are done: the next pass repairs
        log.warning("window repair failed (%s: %s)", type(error).__name__, error)
    if store.archive.store is not None and r.set(
            store.keys.recovery("archive"), "1", nx=True, px=int(RESULTS_RETRY_S * 1000)):
        for job_id in store.outcomes.keep_pending():
            log.warning("job %s: copied to the results store, which did not answer when the "
                        "job ended or its records were stored", job_id)
        jobs, oldest_s = store.outcomes.behind()
        if jobs:  # said each pass (every 30 s, one worker) until it has caught up
            log.warning("results store %s is behind: %d job(s) not copied there yet, the "
                        "oldest for %.0f s; Redis keeps them, and they are copied once it "
                        "answers", store.archive.store.where, jobs, oldest_s)
    return sent


def take_over_dead_workers(store: JobStore, settings: Settings, send: Send,
                           schedulers: Schedulers, dead: list[str] | None = None
                           ) -> list[tuple[str, Part]]:
    """Step 1: every part a dead worker held goes back on the broker with a new token."""
    r, claims = store.r, store.claims
    sent: list[tuple[str, Part]] = []
    for worker, is_alive in registered_workers(r, store.prefix).items():
        if is_alive:
            continue
        if dead is not None:
            dead.append(worker)
        broker_fault = stuck_on_its_broker(r, store.prefix, worker)
        for held in claims.held_by(worker):
            part: Part = int(held.part) if held.part.isdigit() else held.part
            previous = claims.claim(held.job_id, part)
            token = claims.takeover(held.job_id, part, held.token, worker)
            if not token:
                continue  # finished, or it moved on before the worker died
            if isinstance(part, int) and _given_up(
                    store, held.job_id, part, settings.max_attempts,
                    died_running=_state(previous) == "running" and not broker_fault):
                continue
            if _send(store, settings, send, schedulers, held.job_id, part, token):
                sent.append((held.job_id, part))
                log.warning("worker %s is gone: %s/%s sent again", worker, held.job_id, part)
            else:
                claims.restore(held.job_id, part, previous, worker, held.token)
        if not r.exists(claims.worker_key(worker)):
            forget_worker(r, store.prefix, worker)
    return sent


ORPHAN_AGE_S = 2.0  # a live worker records a receipt within milliseconds of taking a message
PARTS = {SUBAGENT_TASK: None, "drover.join_results": "join", "drover.plan_job": "plan"}


def resend_orphans(store: JobStore, settings: Settings, send: Send, schedulers: Schedulers
                   ) -> list[tuple[str, Part]]:
    """Step 1, Redis broker: unacked messages whose receipt nobody recorded (their worker
    died in between, or Redis was away then), older than a moment, are sent again with a new
    token. Reads only what the workers hold (the ``unacked`` hash), never the queue."""
    r = store.r
    base = f"{store.prefix}:celery:"
    older = store.meta.server_time() - max(ORPHAN_AGE_S, settings.heartbeat_s)
    # Members only (redis-py types the reply with WITHSCORES' pairs too).
    tags = cast(list[bytes], r.zrangebyscore(base + "unacked_index", "-inf", older))
    sent: list[tuple[str, Part]] = []
    for start in range(0, len(tags), 500):
        for raw in r.hmget(base + "unacked", tags[start:start + 500]):
            found = _part_of(raw)
            if found is None:
                continue
            job_id, part, token = found
            new = store.claims.takeover(job_id, part, token, "")
            if new and _send(store, settings, send, schedulers, job_id, part, new):
                sent.append((job_id, part))
                log.warning("%s/%s: its message was taken by a worker that died or lost Redis "
                            "before it said so; sent again", job_id, part)
    return sent


def _part_of(raw: bytes | str | None) -> tuple[str, Part, int] | None:
    """(job id, part, claim token) of one of our messages in kombu's unacked hash."""
    if raw is None:
        return None
    try:
        message = json.loads(raw)[0]
        headers = message.get("headers") or {}
        if headers.get("task") not in PARTS:
            return None
        body = message.get("body")
        if (message.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        token = int(headers.get("drover_token") or 0)
        if headers["task"] == SUBAGENT_TASK:
            return str(args[0]), int(args[1]), token
        return str(args[-1]), PARTS[headers["task"]], token  # type: ignore[return-value]
    except (ValueError, TypeError, KeyError, IndexError):
        return None  # not a message of ours


def join_recovered_jobs(store: JobStore, send: Send) -> list[tuple[str, Part]]:
    """Step 2: the join of a job with re-sent sub-agents, once every record is in."""
    r = store.r
    key = store.keys.recovering
    sent: list[tuple[str, Part]] = []
    for job_id in [_s(j) for j in r.smembers(key)]:
        meta = _meta(store, job_id)
        if meta.get("status") not in ACTIVE or store.outcomes.exists(job_id):
            r.srem(key, job_id)
            continue
        if store.records.count(job_id) < int(meta.get("n", 0)):
            continue
        r.srem(key, job_id)
        if _send_join(store, send, meta.get("queue"), job_id):
            sent.append((job_id, "join"))
    return sent


def _send_join(store: JobStore, send: Send, queue: str | None, job_id: str) -> bool:
    """Send the job's join, unless a live worker holds or runs one (a dead one's: step 1)."""
    claim = store.claims.claim(job_id, "join") or "0|sent|"
    _token, state, holder = claim.split("|", 2)
    if state in ("held", "running") and alive(store.r, store.prefix, [holder])[holder]:
        return False
    token = store.claims.takeover(job_id, "join", -1, "")
    return bool(token) and _send_to(send, queue, job_id, "join", token)


def resend_lost_messages(store: JobStore, settings: Settings, send: Send,
                         schedulers: Schedulers, after_s: float | None = None
                         ) -> list[tuple[str, Part]]:
    """Step 3: a stalled job's join, and its sub-agents whose message is gone.

    Redis broker: with late acks every unfinished sub-agent has a message in the broker
    (queued, or unacked while it runs or waits out a countdown); one with none, for as long
    as the job has gained no record, was lost whatever its claim says (a worker that was
    holding it when Redis restarted, a BRPOP whose reply never arrived).
    RabbitMQ: the broker cannot be read that way, and it does not lose messages; what a
    failover loses is drover's state of a delivery RabbitMQ has already acked (its record,
    or the task ended on a Redis error). A sub-agent that no live worker holds or runs, in a
    job without a record for so long, is sent again (a queued copy is stale at once)."""
    now = store.meta.server_time()
    sent: list[tuple[str, Part]] = []
    unfinished: list[tuple[str, str, list[int]]] = []  # job, queue, sub-agents to look at
    for job_id in store.meta.recent(limit=RECENT_JOBS):
        meta = _meta(store, job_id)
        queue = meta.get("queue") or settings.queue
        if meta.get("status") not in ACTIVE or "launched" not in meta:
            continue
        n, done = int(meta["n"]), store.records.count(job_id)
        if not _stalled(store, job_id, done, now, after_s or settings.resend_after_s):
            continue
        if done >= n:
            if not store.outcomes.exists(job_id) and _send_join(store, send, queue, job_id):
                sent.append((job_id, "join"))
            continue
        unfinished.append((job_id, queue, _waiting(store, schedulers(queue), job_id, n)))
    sent += _resend_gone(store, settings, send, unfinished)
    return sent


def _waiting(store: JobStore, fs: FairShare, job_id: str, n: int) -> list[int]:
    """The job's published sub-agents without a record (nor parked for a Message Batch):
    those the fair-share window has not published yet are not lost, only waiting."""
    dispatched = fs.dispatched(job_id)
    waiting = set(range(n if dispatched is None else min(n, dispatched)))
    return sorted(waiting - _accounted_for(store, job_id))


def _resend_gone(store: JobStore, settings: Settings, send: Send,
                 unfinished: list[tuple[str, str, list[int]]]) -> list[tuple[str, Part]]:
    """Of each (job, queue, sub-agents) of a stalled job, send again the sub-agents whose
    message the broker no longer has (Redis: neither queued nor unacked) and that no live
    worker runs (RabbitMQ: holds or runs)."""
    r = store.r
    rabbitmq = settings.broker_is_rabbitmq
    sent: list[tuple[str, Part]] = []
    # The broker is read after each job's records and parked sub-agents and before they are
    # read again: a sub-agent parks before its message leaves the broker, so one that parks
    # meanwhile is seen in one of the reads, and one resumed meanwhile too unless its resume
    # was between the parked list and the broker (a moment). A resend then costs a message:
    # the batch turn is queued under the claim (workers/agent/batch.py), so not twice.
    queues = {q for _, q, indexes in unfinished if indexes}
    in_broker = {q: set() if rabbitmq else subagents_in_broker(r, store.prefix, q)
                 for q in queues}
    for job_id, queue, indexes in unfinished:
        accounted = _accounted_for(store, job_id) if indexes else set()
        for index in indexes:
            if index in accounted or (job_id, index) in in_broker[queue]:
                continue
            if _on_a_live_worker(store, job_id, index, ("held", "running") if rabbitmq
                                 else ("running",)):
                continue  # kombu handed its message out again and a late copy acked it
            token = store.claims.takeover(job_id, index, -1, "")
            if not token or _given_up(store, job_id, index, settings.max_attempts,
                                      died_running=False):  # the broker's loss, not a death
                continue
            if _send_to(send, queue, job_id, index, token):
                r.sadd(store.keys.recovering, job_id)
                sent.append((job_id, index))
                log.warning("sub-agent %s/%d: no live worker holds or runs it%s; sent again",
                            job_id, index, "" if rabbitmq else ", and the broker has no message "
                            "of it")
    return sent


def _resend_unheld(store: JobStore, settings: Settings, send: Send, fs: FairShare,
                   job_id: str, n: int, now: float) -> list[tuple[str, Part]]:
    """A job with sub-agents out that no live worker holds or runs, and no record for a
    heartbeat TTL, has its sub-agents whose message is gone sent again (step 3 for that job,
    at once; on RabbitMQ, whose queue cannot be read, every one no live worker holds or runs:
    a copy still queued is stale at once and stops before any call).

    A connection that goes silent can take a message with it: the consumer's BRPOP popped
    it and it never reached the worker's unacked list (seen when the silenced consumer
    reconnects: the job's last sub-agent had no claim and no message). Step 3 looks for such
    a message after a TTL only once some heartbeat saw Redis go away (``mark_message_gap``),
    and a heartbeat whose own connection was not among the silenced ones sees nothing: the
    job then waited DROVER_RESEND_AFTER_S (120 s). A job that nobody works on says so by
    itself, whoever noticed what."""
    if not _stalled(store, job_id, store.records.count(job_id), now, settings.heartbeat_ttl_s):
        return []
    return _resend_gone(store, settings, send,
                        [(job_id, fs.queue, _waiting(store, fs, job_id, n))])


def _accounted_for(store: JobStore, job_id: str) -> set[int]:
    """The job's sub-agents with a record, or parked: waiting for a Message Batch, task-less
    on purpose (the batcher resumes them, workers/agent/batch.py)."""
    pipe = store.r.pipeline(transaction=False)
    pipe.hkeys(store.keys.job(job_id, "records"))
    pipe.hkeys(store.keys.job(job_id, "bpark"))
    recorded, parked = pipe.execute()
    return {int(i) for i in [*recorded, *parked]}


def stall_after_s(settings: Settings) -> float:
    """A job with sub-agents out and no record for this long, none held by a live worker,
    is stalled (three heartbeat TTLs: a dead worker's parts are back well before)."""
    return 3 * settings.heartbeat_ttl_s


def stalled_jobs(r: redis.Redis, prefix: str) -> dict[str, dict[str, Any]]:
    """The jobs the sweep found stalled and has not seen move since: id -> what it saw."""
    stalled = r.hgetall(JobKeys(prefix).stalled)
    return {_s(job_id): json.loads(raw) for job_id, raw in stalled.items()}


def window_repairs(r: redis.Redis, prefix: str) -> dict[str, int]:
    """How often the sweep had to repair the window or a claim, by kind (since the keys live)."""
    return {_s(k): int(v) for k, v in r.hgetall(JobKeys(prefix).recovery("repairs")).items()}


def _count_repair(store: JobStore, kind: str, n: int = 1) -> None:
    key = store.keys.recovery("repairs")
    store.r.hincrby(key, kind, n)
    store.r.expire(key, store.ttl_s)


def repair_windows(store: JobStore, settings: Settings, send: Send, schedulers: Schedulers,
                   queue: str | None = None) -> list[tuple[str, Part]]:
    """Step 4: every job of the queue's window checked against its claims and the heartbeats."""
    r = store.r
    fs = schedulers(queue or settings.queue)
    now = store.meta.server_time()
    sent: list[tuple[str, Part]] = []
    stalled_key = store.keys.stalled
    for share in fs.jobs():
        if share.calls:  # a process's calls, no job's sub-agents (the pump watches them)
            continue
        job_id = share.job_id
        claims = {_s(k): _s(v) for k, v in r.hgetall(store.keys.job(job_id, "claims")).items()}
        parsed = {part: (raw.split("|", 2) + ["", ""])[:3] for part, raw in claims.items()}
        holders = sorted({h for _, state, h in parsed.values()
                          if state in ("held", "running") and h})
        living = alive(r, store.prefix, holders) if holders else {}
        resent = 0
        for part, (token, state, holder) in parsed.items():
            if state not in ("held", "running") or not holder or living.get(holder, True):
                continue
            key: Part = int(part) if part.isdigit() else part
            new = store.claims.takeover(job_id, key, int(token), holder)
            if not new:
                continue
            if isinstance(key, int) and _given_up(
                    store, job_id, key, settings.max_attempts, died_running=state == "running"
                    and not stuck_on_its_broker(r, store.prefix, holder)):
                continue
            if _send(store, settings, send, schedulers, job_id, key, new):
                sent.append((job_id, key))
                resent += 1
                log.warning("%s/%s: its claim named worker %s, which is gone, but the worker's "
                            "list did not: sent again by the window's repair", job_id, part,
                            holder)
        if share.out > 0 and not any(living.values()):
            gone = _resend_unheld(store, settings, send, fs, job_id, share.n, now)
            sent += gone
            resent += len(gone)
        handed_back = 0
        deferred = fs.deferred_indexes(job_id)
        if deferred:
            pipe = r.pipeline(transaction=False)
            ordered = sorted(deferred)
            for index in ordered:
                pipe.hexists(store.keys.job(job_id, "records"), str(index))
            recorded = pipe.execute()
            stale = []
            for index, has_record in zip(ordered, recorded, strict=True):
                _token, state, holder = parsed.get(str(index), ("0", "sent", ""))
                if has_record or state == "running" or (
                        state == "held" and not living.get(holder, True)):
                    stale.append(index)
            if stale or share.deferred != len(deferred):
                fs.undefer(job_id, stale)
                handed_back = len(stale) + abs(share.deferred - len(deferred))
                log.warning("job %s: the window counted %d sub-agents as waiting out a "
                            "countdown that were not (recorded, running, or their worker "
                            "died); their places are handed back", job_id, handed_back)
        if resent:
            _count_repair(store, "resent", resent)
        if handed_back:
            _count_repair(store, "window_places", handed_back)
        _note_stall(store, stalled_key, share, now, any(living.values()), settings, resent,
                    handed_back)
    for job_id in list(stalled_jobs(r, store.prefix)):
        if fs.dispatched(job_id) is None:  # out of the window: ended, removed or expired
            r.hdel(stalled_key, job_id)
    return sent


def _note_stall(store: JobStore, stalled_key: str, share: Any, now: float, held_alive: bool,
                settings: Settings, resent: int, handed_back: int) -> None:
    """Track when the job last gained a record; flag (and log once) a stall, clear it on
    the next record."""
    r, job_id = store.r, share.job_id
    key = store.keys.job(job_id, "progress")
    seen = r.hmget(key, "done", "since")
    if seen[0] is None or int(seen[0]) != share.done:
        r.hset(key, mapping={"done": share.done, "since": now})
        r.expire(key, store.ttl_s)
        if r.hdel(stalled_key, job_id):
            log.warning("job %s is moving again (%d/%d records)", job_id, share.done, share.n)
        return
    since = float(seen[1] or now)
    quiet_s = now - since
    if share.out <= 0 or held_alive or quiet_s < stall_after_s(settings):
        return
    info = {"since": since, "out": share.out, "done": share.done, "n": share.n,
            "resent": resent, "handed_back": handed_back}
    if r.hsetnx(stalled_key, job_id, json.dumps(info)):
        r.expire(stalled_key, store.ttl_s)
        _count_repair(store, "stalled_jobs")
        log.warning("job %s stalled: %d sub-agents out, no record for %.0f s and no live "
                    "worker holds any of them; repaired: %d sent again, %d window places "
                    "handed back (the sweep keeps checking it)", job_id, share.out, quiet_s,
                    resent, handed_back)


def _on_a_live_worker(store: JobStore, job_id: str, index: int, states: tuple[str, ...]
                      ) -> bool:
    """The sub-agent's claim is in one of ``states`` on a worker whose heartbeat is alive.

    A sub-agent running there is not lost even when the Redis broker holds no message for
    it: a task that runs past the visibility timeout is handed out again by kombu, and the
    late copy stops and acks it. (On RabbitMQ a held one is the worker's too: prefetched, or
    waiting out a countdown.) If that worker dies, the dead-worker step recovers it."""
    raw = store.claims.claim(job_id, index)
    _token, state, worker = ((raw or "").split("|", 2) + ["", ""])[:3]
    return state in states and bool(worker) and alive(store.r, store.prefix, [worker])[worker]


def _send(store: JobStore, settings: Settings, send: Send, schedulers: Schedulers, job_id: str,
          part: Part, token: int) -> bool:
    queue = _meta(store, job_id).get("queue") or settings.queue
    if isinstance(part, int):
        store.r.sadd(store.keys.recovering, job_id)
    if not _send_to(send, queue, job_id, part, token):
        return False
    if isinstance(part, int):
        # Its lost copy may have been waiting out a countdown, counted as such in the window:
        # the copy sent now is a part about to run, so that place goes back at once (the
        # new copy's "resume" then changes nothing).
        fs = schedulers(queue)
        if store.r.sismember(fs.deferred_key(job_id), str(part)):
            fs.undefer(job_id, [part])
    return True


def _send_to(send: Send, queue: str | None, job_id: str, part: Part, token: int) -> bool:
    try:
        send(queue or "", job_id, part, token)
        return True
    except Exception as error:  # the broker is away: the next sweep tries again
        log.warning("could not send %s/%s again (%s: %s)", job_id, part, type(error).__name__,
                    error)
        return False


def _given_up(store: JobStore, job_id: str, index: int, max_attempts: int,
              died_running: bool) -> bool:
    """Count one more re-send (``died_running``: its worker died while running it, which
    counts against ``max_attempts``); past that the sub-agent gets a failed record."""
    store.counters.add_resend(job_id, index)
    if not died_running or store.counters.add_death(job_id, index) <= max_attempts:
        return False
    message = (f"this sub-agent's worker died while running it {max_attempts} times (the task "
               "may kill the worker it runs on); gave up")
    log.error("sub-agent %s/%d: %s", job_id, index, message)
    store.records.put(SubagentResult(job_id=job_id, index=index, status="failed",
                                     attempts=max_attempts, error_type="task_lost", error=message,
                                     finished_at=time.time()))
    store.r.sadd(store.keys.recovering, job_id)
    return True


def _state(raw: str | bytes | None) -> str:
    """The state of a claim's raw value ``token|state|worker`` ("" for none)."""
    return (_s(raw).split("|", 2) + ["", ""])[1] if raw else ""


def _meta(store: JobStore, job_id: str) -> dict[str, str]:
    try:
        return store.meta.get(job_id)
    except LookupError:  # expired
        return {}


def _stalled(store: JobStore, job_id: str, done: int, now: float, after_s: float) -> bool:
    """True once the job has kept ``done`` records for ``after_s`` (then the wait restarts)."""
    key = store.keys.job(job_id, "sweep")
    seen = store.r.hgetall(key)
    count = int(seen.get(b"records", -1)) if seen else -1
    since = float(seen.get(b"since", now)) if seen else now
    if count != done or now - since < after_s:
        if count != done:
            store.r.hset(key, mapping={"records": done, "since": now})
            store.r.expire(key, store.ttl_s)
        return False
    store.r.hset(key, "since", now)  # act at most once per wait
    return True



_started = threading.Lock()
_thread: threading.Thread | None = None


def start_sweeper(send: Send, store: JobStore, schedulers: Schedulers,
                  settings: Settings | None = None) -> None:
    """Start this process's sweeper thread (once); called when a worker is ready.

    ``send`` puts a part on the broker again (the tasks module passes Celery's; this package
    knows no Celery); ``store`` and ``schedulers`` are the process's job store and its
    queues' schedulers, from the worker's root (``app.drover``)."""
    global _thread
    with _started:
        if _thread is not None and _thread.is_alive():
            return
        settings = settings or get_settings()
        _thread = threading.Thread(target=_sweep_forever,
                                   args=(store, settings, send, schedulers),
                                   name="drover-recovery", daemon=True)
        _thread.start()


def _sweep_forever(store: JobStore, settings: Settings, send: Send,
                   schedulers: Schedulers) -> None:
    interval = sweep_interval_s(settings)
    while True:
        time.sleep(interval * random.uniform(0.8, 1.2))
        try:
            sweep(store, settings, send, schedulers)
        except Exception as error:  # Redis away, a broker hiccup: try again next time
            log.warning("recovery sweep failed (%s: %s)", type(error).__name__, error)
