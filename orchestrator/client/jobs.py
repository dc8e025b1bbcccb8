"""The Python API: ``submit(spec) -> JobHandle``.

``submit`` validates everything it can before anything is enqueued (the spec, the tool names,
the fan-out cap), writes the job to Redis and publishes the job's first window of sub-agents
in one pipelined round trip (the rest follow as places free, see workers/fairshare/scheduler.py;
for a goal it sends a planning task that does the same): a few round trips for any fan-out,
so it returns at once and the handle works before the sub-agents are all on the broker. A
handle can be re-attached by id from any process with ``JobHandle.attach(job_id)``:
everything it reads lives in Redis.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from drover.config import Settings, get_settings
from drover.config.providers import about
from drover.errors import JobNotFound, JobRefused, Unreachable, WaitTimeout
from drover.orchestrator.client.workers import WorkerWatch, warn_if_unserved, workers_line
from drover.workers.agent.caching import prefix_tokens
from drover.workers.agent.fits import spec_never_fits
from drover.workers.connections.preflight import check_services, import_tool_modules
from drover.workers.jobs.meta import ACTIVE
from drover.workers.jobs.records import STATUSES, JobResult, SubagentReport, SubagentResult
from drover.workers.jobs.spec import JobSpec, thinking_refused
from drover.workers.jobs.store import JobStore
from drover.workers.services import Services, services
from drover.workers.telemetry import job_submitted
from drover.workers.tools import SUBAGENTS, get_subagent, get_tools, reserved


def submitter_services(settings: Settings) -> Services:
    """The submitter's root: this process's parts for ``settings``, built on its first call
    (and again after a fork or for other settings); every handle carries them, and ``plan()``
    (the submitter's other entry point) runs on them."""
    return services(settings)


# The service URLs this process has reached once; later trouble is the clients' reconnects'.
_REACHED: set[tuple[str, str, str]] = set()


def _first_contact(settings: Settings) -> None:
    """Unreachable within a few seconds, naming the setting, when Redis or the broker does not
    answer (the clients' own reconnect loop is for a Redis that restarts under a running job:
    about a minute, then a traceback that names nothing)."""
    urls = (settings.redis_url, settings.broker, settings.backend)
    if urls not in _REACHED:
        check_services(settings)
        _REACHED.add(urls)


def check_spec(spec: JobSpec, settings: Settings) -> None:
    """Refuse, with a message that says what to fix, what the workers would fail on later."""
    import_tool_modules(settings)  # from the working folder too, as the worker does
    tools = get_tools(spec.tools) if spec.tools else []  # JobRefused naming unknown tools
    if spec.subagent is not None:
        check_subagent(spec, settings)
    model = spec.model or settings.model
    on = settings.provider_of(model)
    if spec.delivery == "batch" and not all(about(p).has_batches
                                            for p in (on, settings.provider)):
        # The batcher runs on workers whose DROVER_PROVIDER is anthropic only.
        why = (f"the model {model!r} is served by {on} (DROVER_MODEL_PROVIDERS)"
               if on != settings.provider else
               f"the model {model!r} is served by {on} (DROVER_PROVIDER={settings.provider})")
        if about(on).has_batches:
            why = (f"the workers' DROVER_PROVIDER is {settings.provider}, and only a worker "
                   "on anthropic runs the batcher")
        raise JobRefused(f"delivery='batch' goes through Anthropic's Message Batches API, and "
                         f"{why}: send the job with delivery='realtime'")
    if spec.max_cost_usd is not None and settings.price_of(model) is None:
        raise JobRefused(f"max_cost_usd caps the job in dollars, and the model {model!r} has no "
                         "price: set its prices in DROVER_PRICES (JSON, dollars per million "
                         f"tokens: '{{\"{model}\": {{\"input\": 3.0, \"output\": 15.0}}}}')")
    no_thinking = thinking_refused(model, spec.thinking)
    if no_thinking is not None:
        raise JobRefused(no_thinking)
    fanout = len(spec.subtasks) + len(spec.inputs)
    if fanout > settings.max_fanout:
        what = "inputs" if spec.inputs else "subtasks"
        raise JobRefused(f"{fanout} {what} exceed the fan-out cap of "
                         f"{settings.max_fanout} (DROVER_MAX_FANOUT)")
    size = spec_bytes(spec)
    if size > settings.max_spec_bytes:
        raise JobRefused(f"the job spec is {size:,} bytes, over the cap of "
                         f"{settings.max_spec_bytes:,} (DROVER_MAX_SPEC_BYTES); send fewer or "
                         "shorter subtasks (or a smaller system prompt), or split the job")
    if spec.subagent is not None:  # its calls are its code's: each is checked as it is made
        return
    tool_chars = sum(len(json.dumps(t.definition())) for t in tools)
    never = spec_never_fits(settings, spec.model or settings.model,
                            prefix_tokens(spec, tool_chars))
    if never is not None:
        raise JobRefused(never)


def check_subagent(spec: JobSpec, settings: Settings) -> None:
    """The job's ``@subagent`` is registered here (from DROVER_TOOL_MODULES, as on the
    workers) and can run as ``await fn(item, llm)``; else JobRefused saying what to fix."""
    if reserved(spec.subagent or ""):  # drover's own loop is no team's function to name
        raise JobRefused(f"subagent={spec.subagent!r} is drover's own agent loop: give it "
                         "subtasks= (or goal=) without subagent=, or name your own @subagent "
                         "function")
    try:
        get_subagent(spec.subagent or "")
    except JobRefused as refused:
        if spec.subagent in SUBAGENTS:  # it is there, but cannot run: say only that
            raise
        modules = ", ".join(settings.tool_modules) or "none"
        raise JobRefused(f"{refused} (DROVER_TOOL_MODULES here: {modules})") from None


def job_tasks(spec: JobSpec) -> list[str]:
    """What the store keeps per sub-agent: the subtasks, or each input as JSON text."""
    if spec.subagent is not None:
        return [json.dumps(item) for item in spec.inputs]
    return list(spec.subtasks)


def spec_bytes(spec: JobSpec) -> int:
    """What the spec takes in Redis: its JSON without the subtasks (or inputs), and each one
    (UTF-8), which the store keeps in a list of their own (Specs.create)."""
    rest = spec.model_copy(update={"subtasks": [], "inputs": []}).model_dump_json()
    return len(rest.encode()) + sum(len(task.encode()) for task in job_tasks(spec))


@job_submitted
def submit(spec: JobSpec | dict[str, Any], *, settings: Settings | None = None) -> JobHandle:
    """Validate ``spec``, store it and start the job; returns at once with a handle.

    Raises pydantic's ValidationError for a bad spec, ``JobRefused`` (a ValueError) for a job
    the workers would refuse (an unknown tool or @subagent, too many subtasks) or whose calls
    no limit could admit (max_tokens over a whole minute of the output-token limit),
    ``Unreachable`` within a few seconds when Redis or the broker does not answer; nothing is
    enqueued then.
    """
    # The Celery app is built only when needed; the tasks go by name (no task module, agent
    # loop or provider SDK is imported here).
    from drover.workers.tasklayer.submitting import launch, send_plan

    settings = settings or get_settings()
    if not isinstance(spec, JobSpec):
        spec = JobSpec.model_validate(spec)
    check_spec(spec, settings)
    if spec.model is None and spec.subagent is None:  # (an @subagent's calls name their own)
        # The job's model is fixed now, as checked: not each reader's or worker's DROVER_MODEL.
        spec = spec.model_copy(update={"model": settings.model})
    _first_contact(settings)
    shared = submitter_services(settings)
    store = shared.store
    job_id = uuid.uuid4().hex
    if spec.goal:
        store.specs.create(job_id, spec, [], status="planning", queue=settings.queue)
        send_plan(job_id, settings.queue)
    else:
        tasks = job_tasks(spec)
        store.specs.create(job_id, spec, tasks, status="queued", queue=settings.queue)
        if store.meta.claim_launch(job_id):
            launch(job_id, len(tasks), settings.queue, tenant=spec.tenant,
                   priority=spec.priority, shared=shared)
    handle = JobHandle(job_id, settings=settings, shared=shared)
    handle._told_unserved = warn_if_unserved(shared.fairshare(settings.queue).live_slots,
                                             store.r, settings, job_id)
    return handle


def _without_thinking(block: Any) -> Any:
    if isinstance(block, dict) and block.get("type") == "thinking":
        return {"type": "thinking", "thinking": f"({len(str(block.get('thinking', '')))} "
                "characters of thinking, shown with DROVER_RECORD_THINKING=1)"}
    return block


class JobHandle:
    """A running or finished job, by id."""

    def __init__(self, job_id: str, *, settings: Settings | None = None,
                 shared: Services | None = None):
        self.id = job_id
        self.settings = shared.settings if shared is not None else settings or get_settings()
        self.shared = shared if shared is not None else submitter_services(self.settings)
        self.store: JobStore = self.shared.store
        self._last_event = "0-0"
        # The submit said no worker serves the queue: its first wait does not say it again.
        self._told_unserved = False

    @classmethod
    def attach(cls, job_id: str, *, settings: Settings | None = None) -> JobHandle:
        """A handle for a job submitted elsewhere; raises JobNotFound for an unknown id."""
        handle = cls(job_id, settings=settings)
        _first_contact(handle.settings)
        handle.store.meta.get(job_id)
        return handle

    def __repr__(self) -> str:
        return f"JobHandle({self.id!r})"

    @property
    def status(self) -> str:
        return self.store.meta.get(self.id).get("status", "unknown")

    def result(self, *, records: bool = True) -> JobResult | None:
        """The JobResult once the join has run, else None. ``records=False``: without its
        records (``results`` empty; status, counts, usage and synthesis in one read), for a
        large job whose records are then read a page at a time with ``records()``."""
        return self.store.outcomes.get(self.id, records=records)

    def wait(self, timeout: float | None = None, poll_s: float = 0.2, *,
             records: bool = True) -> JobResult:
        """Block until the join has stored the JobResult; ``WaitTimeout`` (a TimeoutError) after
        ``timeout``. ``records=False`` as for ``result()``: the handle then holds no record,
        and ``records()`` pages through them (what a job of 100,000 wants).

        When nothing finishes for a few seconds and no worker consumes the job's queue, a
        warning says so (and how to start one), unless this handle's submit said it just before
        (its first wait then does not repeat it); the wait goes on."""
        deadline = None if timeout is None else time.monotonic() + timeout
        told, self._told_unserved = self._told_unserved, False
        watch = WorkerWatch(self.id, self.settings.queue, self.store.records.count(self.id),
                            told=told)
        while True:
            result = self.store.outcomes.get(self.id, records=records)
            if result is not None:
                return result
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"job {self.id} not finished after {timeout:g} s: "
                                   f"{self._stalled(watch)}")
            watch.check(self.store.records.count(self.id))
            time.sleep(poll_s)

    def _stalled(self, watch: WorkerWatch) -> str:
        """What a WaitTimeout says: how many sub-agents are pending, whether workers live."""
        progress = self.progress()
        return (f"{progress['pending']} of {progress['total']} sub-agents pending; "
                f"{watch.hint or workers_line(self.store.r, self.settings)}")

    def progress(self) -> dict[str, int]:
        """Counts per status, plus ``pending`` (not finished yet) and ``total`` (one read)."""
        total = int(self.store.meta.get(self.id).get("n", 0))
        counts = self.store.records.status_counts(self.id, total)
        counts["total"] = total
        counts["pending"] = total - sum(counts[s] for s in STATUSES)
        return counts

    def generating(self) -> int:
        """How many sub-agents' answers are streaming in now (their first token came)."""
        return self.store.counters.generating_count(self.id)

    def record(self, index: int) -> SubagentResult | None:
        """Sub-agent ``index``'s full record (a JobResult's copy may have its text cut)."""
        return self.store.records.get(self.id, index)

    def records(self) -> Iterator[SubagentResult]:
        """Every stored record in index order, read a page at a time (for large jobs)."""
        total = int(self.store.meta.get(self.id).get("n", 0))
        for _, record in self.store.records.walk(self.id, total):
            if record is not None:
                yield record

    def as_completed(self, timeout: float | None = None, *, after: str | None = None
                     ) -> Iterator[SubagentResult]:
        """Yield each sub-agent's record as it finishes (each once), until all are in.

        Like ``asyncio.as_completed``: the order is the order of finishing, and ``timeout``
        bounds the whole iteration (WaitTimeout). A cancelled job's stream ends too, once
        every sub-agent has its record. Resumable: the handle remembers the last stream entry
        it yielded (``last_event``), and any handle, in any process, continues from one with
        ``after=``. A job Redis no longer has (its TTL ran out) yields every record from the
        results store, in index order: the order of finishing went with Redis's stream.
        """
        if self.store.archive.gone(self.id):
            yield from self.records()
            return
        if after is not None:
            self._last_event = after
        seen: set[int] = set()
        deadline = None if timeout is None else time.monotonic() + timeout
        told, self._told_unserved = self._told_unserved, False
        watch = WorkerWatch(self.id, self.settings.queue, 0, told=told)
        while True:
            fresh = False
            for entry_id, record in self.store.stream.events(self.id, self._last_event,
                                                             block_ms=500):
                self._last_event = entry_id
                fresh = True
                if record.index not in seen:
                    seen.add(record.index)
                    yield record
            if fresh:
                continue
            meta = self.store.meta.get(self.id)
            total = int(meta.get("n", 0))
            all_in = total > 0 and self.store.records.count(self.id) >= total
            # A record enters the hash a moment before the stream: look once more before ending.
            if (all_in or meta.get("status") not in ACTIVE) and self._caught_up():
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"job {self.id}: not every record arrived within {timeout:g} s "
                                   f"({self._stalled(watch)}); resume with "
                                   f"after={self._last_event!r}")
            watch.check(len(seen))

    @property
    def last_event(self) -> str:
        return self._last_event

    def _caught_up(self) -> bool:
        return not any(True for _ in self.store.stream.events(self.id, self._last_event, count=1))

    def report(self, index: int) -> SubagentReport | None:
        return self.store.records.report(self.id, index)

    def transcript(self, index: int) -> list[dict[str, Any]]:
        """The sub-agent's full conversation (for debugging), while the job's records live
        (in Redis, or in the results store: docs/results-store.md).

        Extended thinking's blocks are shown only with DROVER_RECORD_THINKING; otherwise
        each says how long it was."""
        state = (self.store.checkpoints.load(self.id, index)
                 or self.store.archive.final_state(self.id, index))
        messages = state.messages if state else []
        if self.settings.record_thinking:
            return messages
        return [{**m, "content": [_without_thinking(b) for b in m["content"]]}
                if isinstance(m.get("content"), list) else m for m in messages]

    def retry(self) -> list[int]:
        """Run the job's sub-agents that did not end ``ok`` (failed, budget_exceeded,
        cancelled) again, as a continuation of this job: the same id, their records replaced,
        the join run again when they are in (``wait()`` then returns the new result). Those
        that succeeded are never sent again. The replaced records' usage stays in the job's
        (every call is counted once). Returns the indexes re-run (none: all were ok).

        JobNotFound for an unknown job, JobRefused for one still running (or one whose
        planning failed: submit it again)."""
        _first_contact(self.settings)
        spec = self.store.specs.get(self.id)
        self._refuse_on_stopped_keys()
        indexes = self.store.outcomes.reopen(self.id, spec.deadline_s)
        if indexes:
            from drover.workers.tasklayer.submitting import relaunch

            meta = self.store.meta.get(self.id)
            relaunch(self.id, indexes, meta.get("queue") or self.settings.queue,
                     int(meta.get("retries") or 1))
        return indexes

    def _refuse_on_stopped_keys(self) -> None:
        """JobRefused when no key could serve a retry: the one key, or every key of the
        pool, is stopped for the provider's spend limit (the retry would end at once)."""
        from drover.workers.agent.spend_limit import is_spend_limit

        off = self.shared.limiter.disabled_keys()
        aliases = [k.alias for k in self.settings.keys] or [self.settings.key_alias]
        stopped = [a for a in aliases if is_spend_limit((off.get(a) or {}).get("reason"))]
        if stopped and len(stopped) == len(aliases):
            enable = " and ".join(f"`drover keys enable {a}`" for a in stopped)
            raise JobRefused(f"the key(s) {', '.join(stopped)} are stopped for the provider's "
                             f"spend limit: raise the limit with the provider, run {enable}, "
                             "then retry the job")

    def cancel(self, reason: str = "cancelled") -> bool:
        """Stop the job on every host; False when it had already ended.

        The sub-agents that have not started get their ``cancelled`` records at once, and
        the join is sent now rather than when the last queued message has come and gone: a
        job of 10,000 ends within seconds of its cancel.
        """
        if not self.store.cancels.cancel(self.id, reason):
            return False
        meta = self.store.meta.get(self.id)
        if "launched" in meta and int(meta.get("n", 0)):
            from drover.workers.tasklayer.dispatch import send_join

            send_join(self.id, meta.get("queue") or self.settings.queue)
        return True


__all__ = ["JobHandle", "JobNotFound", "Unreachable", "submit", "submitter_services"]
