"""Fair share of one queue between jobs, tenants and priorities: bounded per-job dispatch.

Why bounded dispatch on one queue rather than a queue per job or tenant: a Celery queue is
FIFO, so whoever publishes first is served first; the only way to change who runs next
without a queue per job is to decide *when* each sub-agent's message is published. Every
active job of a queue keeps only its share of a *window* of messages out (in the broker or
running); each finished sub-agent frees one place, and ``fairshare.lua`` hands it to whichever
job is furthest below its share. A job submitted behind a large backlog is therefore behind at
most one window, never behind the whole backlog. A queue per job would need
``add_consumer``/``cancel_consumer`` broadcast to every worker on each submit and finish,
workers finding the active queues at start-up, and kombu's round-robin cycle gives equal
turns only (no weights, no priorities, and a worker's prefetch still takes whole batches
from one queue); per-message priorities cannot reorder what is already queued.

The window is the live workers' slots (each worker reports its concurrency every few seconds),
or ``DROVER_DISPATCH_WINDOW``. So the share of the window is the share of the worker slots;
and since every running sub-agent queues for the limiter on equal terms, it is also, for
sub-agents of similar size, the share of the key's capacity. A tenant's own token budget is a
limiter scope of its own (``tenant_budget_scopes``) acquired beside the model's scope.

The guarantee, while a tenant has sub-agents waiting: it keeps at least
``weight / sum of the weights of the tenants with work waiting`` of the window (more when the
others need less; to within one place at any instant, exactly on average); inside a tenant,
every waiting priority level below the highest keeps at least ``DROVER_PRIORITY_FLOOR``
(10 %) of the tenant's part, the highest level the rest; inside a level, the jobs share
equally. So a ``batch`` job behind continuous ``interactive``
work of its tenant still runs at no less than 10 % of that tenant's slots.

A sub-agent waiting out a retry countdown holds no worker slot: ``defer``/``resume`` keep it
in its job's share but out of the window, so the others can use the slot. Both count once per
sub-agent (a set of the job's deferred indexes), so copies of its task (the broker's
redelivery after a worker died, the sweep's re-send, which both say "resume") cannot make the
window drift.

State: one hash per queue, ``{prefix}:fs:{<queue>}:jobs`` (a hash tag per queue, so it works
on Redis Cluster), changed only by the Lua script; ``done`` is only ever raised to the job
store's record count, so a duplicate delivery or a lost update cannot make it drift.
Knows no Celery: the caller publishes the ``Dispatch`` runs it gets back, then says so
(``published``). Until then each grant is listed with who holds it (``:granted``): a worker
killed between the grant and the publish would otherwise leave sub-agents counted as out that
no broker has, and on RabbitMQ nothing else would ever find them. The pump publishes again
the grants of a holder whose heartbeat is gone (or, from outside a worker, older than
``ORPHAN_GRANT_S``); a sub-agent published twice runs once (claims) and is recorded once.

**Waiting in line when the key is the bottleneck.** Slots are not the only bound: a running
sub-agent that the limiter cannot serve within ``DROVER_HORIZON_S`` would leave its slot for a
Celery retry with a countdown, which on the Redis broker is a new message that a worker takes
at once and holds in memory until its ETA (one broker round trip, one Flower retry and one part
a dying worker takes with it per refusal, and a sub-agent that comes back from a jittered
countdown misses the capacity it waited for). So the window has a second bound, the *line
cap*: sub-agents out over all jobs (running *and* deferred) at most what the limiter can serve
within its horizon, ``0.8 x (horizon - cooldown + burst) x calls/s``, where calls/s is the
scope's rate (its learned share included) over the cost of a mean call in each limited
dimension (requests: 1; tokens: the mean per request of the scope's last minute, or the
submitter's estimate of a first call before there is one). Each out sub-agent has at most
one call waiting for the limiter, and the limiter serves waiting calls in the order they
asked (GCRA reservations), so with at most that many out no wait exceeds the horizon: the
rest wait here, unpublished, in the order the fair-share rule gives, and are published when
a place frees (a record) or the cap grows (the pump, every ``PUMP_S``). Each worker's pump
computes the cap (``workers/agent/capacity.py``) and writes it beside the slots; the script
reads it at each grant. The scope is the jobs' model class (with a pool of keys, the
organisation's level or the sum of the keys' own limits, whichever is less). Jobs of several
model classes on one queue share one line, the sum of their classes' caps: no class waits
behind another's limit, but while both have work waiting, one class may hold more than its
cap and send the surplus into countdowns; a queue per model class keeps each line exact.

Why this rather than a reservation queue the limiter hands out in order: the window already
is an ordered line (by tenant share, priority and arrival) whose places the records free,
and it already survives kills (grants listed with their holder, the sweep's reconciliation);
a second queue in the limiter would need its own order, its own recovery and a hand-off
between the two. Sizing the window by what the limiter can grant keeps one line, one
order and one place where a sub-agent waits (Redis, in no broker and no worker's memory:
nothing to lose on a kill -9), and a sub-agent that merely waited is published once and
runs without a retry. What the cap cannot foresee (another consumer of the key taking more,
a 429's cooldown longer than the horizon, a tenant's spent budget) still ends in a Celery
countdown: that is what countdowns are for (a 429's retry-after, a 529's backoff, a tool's
retry), and the cap shrinks at the next pump so the line holds the rest. Batch jobs are not
in the window (Message Batches have limits of their own).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from importlib import resources

import redis

from drover.config import Settings
from drover.workers.jobs import reply_text as _s
from drover.workers.jobs.liveness import alive
from drover.workers.jobs.spec import PRIORITIES

__all__ = ["CALLS_PREFIX", "ORPHAN_GRANT_S", "PUMP_S", "Dispatch", "FairShare", "JobShare",
           "calls_job_id"]

log = logging.getLogger(__name__)
PUMP_S = 2.0  # how often each worker reports its slots and one of them tops the window up
# A grant made outside a worker (``submit``) has no heartbeat to watch: it counts as lost when
# still unpublished after this long (a publish rides out a broker restart for about a minute).
ORPHAN_GRANT_S = 90.0
_SCRIPT = resources.files("drover.workers.fairshare").joinpath("lua/fairshare.lua").read_text()
# A process's calls from outside the fleet (the gateway's), one job per tenant (``calls.py``).
CALLS_PREFIX = "calls:"


def calls_job_id(process: str, tenant: str) -> str:
    """The window's job of ``process``'s calls of ``tenant`` (``process``: no colon)."""
    return f"{CALLS_PREFIX}{process}:{tenant}"


@dataclass(frozen=True)
class Dispatch:
    """Sub-agents ``first .. first + count - 1`` of a job: publish them now."""

    job_id: str
    first: int
    count: int

    def indices(self) -> range:
        return range(self.first, self.first + self.count)


@dataclass(frozen=True)
class JobShare:
    """One active job as the scheduler sees it."""

    job_id: str
    tenant: str
    priority: str
    weight: float
    n: int
    dispatched: int  # sub-agents published so far
    done: int        # records in
    arrival: int     # order of arrival on the queue
    deferred: int = 0  # out, but waiting out a retry countdown (holding no worker slot)
    started: float = 0.0  # Redis time of its arrival in the window (0: unknown)
    calls: bool = False  # a process's calls from outside the fleet (the gateway's): no job

    @property
    def process(self) -> str:
        """The process whose calls a calls job holds ("" for a job of the fleet)."""
        return self.job_id[len(CALLS_PREFIX):].split(":", 1)[0] if self.calls else ""

    @property
    def out(self) -> int:
        """Sub-agents in the broker or running: its part of the window."""
        return max(0, self.dispatched - self.done)

    @property
    def waiting(self) -> int:
        """Sub-agents not yet published: its backlog, waiting in line."""
        return self.n - self.dispatched

    def last_dispatch_in_s(self, now: float) -> float | None:
        """Expected seconds until its last sub-agent is published, at the rate its records
        have come in since it arrived (None before its first record; 0 with none waiting)."""
        if not self.waiting:
            return 0.0
        if not self.done or not self.started or now <= self.started:
            return None
        return self.waiting / (self.done / (now - self.started))


class FairShare:
    """The dispatch window of one queue (every method is one atomic script call or a read)."""

    def __init__(self, client: redis.Redis, *, prefix: str = "drover", queue: str = "drover",
                 window: int = 0, fallback_window: int = 32, floor: float = 0.1,
                 ttl_s: int = 7 * 24 * 3600, average_s: float = 5.0, holder: str = ""):
        self.r = client
        self.prefix = prefix
        self.queue = queue
        self.holder = holder  # this process's worker id: who publishes what it is granted
        self.base = f"{prefix}:fs:{{{queue}}}"
        self.window = window
        self.fallback_window = fallback_window
        self.floor = floor
        self.ttl_s = ttl_s
        self.average_s = average_s  # the odd place of the window follows 5-s averages
        self._script = client.register_script(_SCRIPT)
        self._window, self._window_at = fallback_window, -1e9

    @classmethod
    def from_settings(cls, client: redis.Redis, settings: Settings, queue: str | None = None,
                      holder: str = "") -> FairShare:
        return cls(client, prefix=settings.key_prefix, queue=queue or settings.queue,
                   window=settings.dispatch_window,
                   fallback_window=settings.dispatch_window_fallback,
                   floor=settings.priority_floor, ttl_s=settings.result_ttl_s, holder=holder)

    @property
    def jobs_key(self) -> str:
        return f"{self.base}:jobs"

    @property
    def slots_key(self) -> str:
        return f"{self.base}:slots"

    @property
    def granted_key(self) -> str:
        return f"{self.base}:granted"

    @property
    def cap_key(self) -> str:
        return f"{self.base}:cap"

    @property
    def leases_key(self) -> str:
        return f"{self.base}:leases"

    def alive_key(self, process: str) -> str:
        """Set while ``process`` (one with a calls job) lives (``calls.CallPlaces``)."""
        return f"{self.base}:alive:{process}"

    def deferred_key(self, job_id: str) -> str:
        return f"{self.base}:deferred:{job_id}"

    # --- the window ---------------------------------------------------------------------
    def report_slots(self, node: str, slots: int, ttl_s: float = PUMP_S * 3) -> None:
        """A worker's concurrency, valid for ``ttl_s`` (workers call this every PUMP_S)."""
        until = self.server_time() + ttl_s
        pipe = self.r.pipeline()
        pipe.hset(self.slots_key, node, f"{slots}:{until}")
        pipe.expire(self.slots_key, int(ttl_s * 10) + 1)
        pipe.execute()

    def live_slots(self) -> int:
        now = self.server_time()
        total = 0
        for node, value in self.r.hgetall(self.slots_key).items():
            slots, until = _s(value).split(":")
            if float(until) >= now:
                total += int(slots)
            else:
                self.r.hdel(self.slots_key, node)
        return total

    def current_window(self) -> int:
        """The window now: the setting, else the live slots (read at most once a second: a
        sub-agent's end should cost one script call, not three round trips)."""
        if self.window:
            return self.window
        now = time.monotonic()
        if now - self._window_at > 1.0:
            self._window = self.live_slots() or self.fallback_window
            self._window_at = now
        return self._window

    def report_cap(self, cap: int, ttl_s: float = PUMP_S * 5, *,
                   through: redis.client.Pipeline | None = None) -> None:
        """The line cap (sub-agents the limiter serves within its horizon), valid ``ttl_s``:
        without a fresh one (no worker has computed it lately) the window has slots only.
        ``through``: a pipeline in MULTI (``capacity.report_line_cap`` writes it only if
        the estimate it was computed from still stands). The script reads the cap itself
        at each grant, so a new one holds from the next grant on, in every process."""
        (through or self.r).set(self.cap_key, max(1, int(cap)), px=int(ttl_s * 1000))

    def report_leases(self, leases: int, ttl_s: float = PUMP_S * 5, *,
                      through: redis.client.Pipeline | None = None) -> None:
        """The lease cap (the limiter's in-flight leases of the line's scopes), valid
        ``ttl_s``: while a process's calls wait or are out, they and the running sub-agents
        hold at most that many places (``fairshare.lua``), so that a call given a place has a
        lease to take."""
        (through or self.r).set(self.leases_key, max(1, int(leases)), px=int(ttl_s * 1000))

    def cap(self) -> int | None:
        """The line cap as last reported (None: none is fresh)."""
        raw = self.r.get(self.cap_key)
        return None if raw is None else int(raw)

    # --- the scheduler ------------------------------------------------------------------
    def add(self, job_id: str, *, n: int, tenant: str, weight: float, priority: str
            ) -> list[Dispatch]:
        """Register a job of ``n`` sub-agents; returns what to publish at once."""
        return self._call("add", job_id, n, tenant, weight, PRIORITIES.index(priority))

    def finished(self, job_id: str, done: int) -> list[Dispatch]:
        """The job now has ``done`` records: its finished sub-agents free their places."""
        return self._call("done", job_id, done)

    def defer(self, job_id: str, index: int) -> list[Dispatch]:
        """A sub-agent of the job waits out a retry countdown: its slot is free meanwhile."""
        return self._call("defer", job_id, index)

    def resume(self, job_id: str, index: int) -> list[Dispatch]:
        """A sub-agent is back on a slot (idempotent: a second copy of its task, or a resume
        of one that was never deferred, changes nothing)."""
        return self._call("resume", job_id, index)

    def undefer(self, job_id: str, indexes: list[int]) -> None:
        """These sub-agents are not waiting out a countdown (the sweep found them recorded,
        running, or with a dead worker); the count is set to the set's size again. Grants
        nothing: the pump's next fill hands out what this freed."""
        self._call("undefer", job_id, *indexes)

    def deferred_indexes(self, job_id: str) -> set[int]:
        return {int(i) for i in self.r.smembers(self.deferred_key(job_id))}

    def remove(self, job_id: str) -> list[Dispatch]:
        """Forget a job (ended, expired) and hand its places to the others."""
        return self._call("remove", job_id)

    def fill(self) -> list[Dispatch]:
        """Hand out the free places of the window (after it grew, or a lost update)."""
        return self._call("fill", "")

    def _call(self, op: str, job_id: str, *args: str | int | float) -> list[Dispatch]:
        reply = self._script(keys=[self.jobs_key, f"{self.base}:seq",
                                   f"{self.base}:tenants", self.granted_key,
                                   self.deferred_key(job_id), self.cap_key,
                                   self.leases_key],
                             args=[op, self.current_window(), self.floor, self.ttl_s,
                                   self.average_s, self.holder, job_id, *args])
        # A calls job's grants are for its process, which waits for them: nothing to publish.
        return [run for run in _runs(reply) if not run.job_id.startswith(CALLS_PREFIX)]

    # --- publishing what was granted ----------------------------------------------------
    def published(self, runs: list[Dispatch]) -> None:
        """The caller has put these grants on the broker: nobody needs to publish them again."""
        if runs:
            self.r.hdel(self.granted_key, *(_grant_field(run) for run in runs))

    def lost_grants(self, orphan_s: float = ORPHAN_GRANT_S) -> list[Dispatch]:
        """Grants whose holder died before saying it published them (a worker whose heartbeat
        is gone, or a grant from outside a worker older than ``orphan_s``); grants of a job
        the scheduler no longer holds (every record in, or removed) are dropped."""
        entries = {_s(field): _s(value).rsplit("|", 1)
                   for field, value in self.r.hgetall(self.granted_key).items()}
        if not entries:
            return []
        jobs = {_s(job_id) for job_id in self.r.hkeys(self.jobs_key)}
        holders = sorted({holder for holder, _ in entries.values() if holder})
        living = alive(self.r, self.prefix, holders) if holders else {}
        now = self.server_time()
        lost, gone = [], []
        for field, (holder, since) in entries.items():
            job_id, first, count = field.rsplit("|", 2)
            if job_id not in jobs:
                gone.append(field)
            elif (not living[holder]) if holder else now - float(since) > orphan_s:
                lost.append(Dispatch(job_id, int(first), int(count)))
        if gone:
            self.r.hdel(self.granted_key, *gone)
        return lost

    def forget_gone_calls(self) -> list[Dispatch]:
        """Forget the calls jobs of processes whose liveness mark is gone (a gateway killed):
        the places their calls held go to the others (returned: what to publish)."""
        runs: list[Dispatch] = []
        for share in self.jobs():
            if share.calls and not self.r.exists(self.alive_key(share.process)):
                log.warning("calls of tenant %s held %d places in the window for a process "
                            "that is gone: freed", share.tenant, share.out)
                runs += self.remove(share.job_id)
        return runs

    # --- reading ------------------------------------------------------------------------
    def dispatched(self, job_id: str) -> int | None:
        """Sub-agents of the job published so far; None when the scheduler holds no such job
        (it never did, or every record is in)."""
        raw = self.r.hget(self.jobs_key, job_id)
        return None if raw is None else int(json.loads(raw)["next"])

    def jobs(self) -> list[JobShare]:
        """The jobs with sub-agents out or waiting, in order of arrival."""
        shares = []
        for job_id, raw in self.r.hgetall(self.jobs_key).items():
            j = json.loads(raw)
            shares.append(JobShare(job_id=_s(job_id), tenant=j["tenant"],
                                   priority=PRIORITIES[int(j["rank"])], weight=float(j["w"]),
                                   n=int(j["n"]), dispatched=int(j["next"]), done=int(j["done"]),
                                   arrival=int(j["seq"]), deferred=int(j.get("deferred", 0)),
                                   started=float(j.get("t0", 0.0)),
                                   calls=bool(j.get("calls"))))
        return sorted(shares, key=lambda s: s.arrival)

    def server_time(self) -> float:
        seconds, micros = self.r.time()
        return seconds + micros / 1e6


def _runs(reply: list) -> list[Dispatch]:
    return [Dispatch(_s(reply[i]), int(reply[i + 1]), int(reply[i + 2]))
            for i in range(0, len(reply), 3)]


def _grant_field(run: Dispatch) -> str:
    return f"{run.job_id}|{run.first}|{run.count}"
