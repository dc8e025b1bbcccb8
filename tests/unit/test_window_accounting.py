"""The bookkeeping that recovery and the fair-share window rest on, against real Redis and
without workers: a claim that a worker holds is always in that worker's list (so the sweep
finds it when the worker dies), and the window's places equal the parts out."""

from __future__ import annotations

import redis

from drover.workers.jobs.claims import Claims


def test_a_retry_received_before_its_release_stays_in_the_workers_list(redis_url, key_prefix):
    """With a thread pool the consumer can take a retry's message (a countdown it keeps in
    memory) before the task's thread has released the claim: the part must stay listed as
    held by that worker, or a kill -9 leaves it 'held' by a dead worker that nobody sweeps
    (issue 24: the job stuck at 27/30)."""
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    claims = Claims(r, key_prefix, 600)
    token = int(claims.start("job", 3, 0, "w1"))  # running on w1
    assert claims.receive("job", 3, token, "w1") == 1  # the retry's message, received first
    assert not claims.release("job", 3, token, "w1")  # then the task's thread lets go
    assert claims.claim("job", 3) == f"{token}|held|w1"
    assert [(h.job_id, h.part) for h in claims.held_by("w1")] == [("job", "3")]
    # The usual order is unchanged: released ("sent", off the list), then received.
    token = int(claims.start("job", 4, 0, "w1"))
    assert claims.release("job", 4, token, "w1")
    assert claims.claim("job", 4) == f"{token}|sent|"
    assert claims.receive("job", 4, token, "w2") == 1
    assert {h.part for h in claims.held_by("w1")} == {"3"}
    assert {h.part for h in claims.held_by("w2")} == {"4"}


def test_each_grant_follows_the_line_cap_reported_last_by_any_process(redis_url, key_prefix):
    """A worker's pump reported a cap from before any estimate of a call (the requests limit
    alone: a large one); then the submitter, knowing the job's calls, a small one. The
    worker's next grant follows the submitter's cap: when each process kept its own copy for
    a second, the worker's first record opened the whole window (issue 31: 40 of 40
    sub-agents out against a cap of 11, 22 of them sent into countdowns)."""
    from drover.workers.fairshare import FairShare

    r = redis.Redis.from_url(redis_url)
    worker = FairShare(r, prefix=key_prefix, queue="q", window=32, holder="w1")
    submitter = FairShare(r, prefix=key_prefix, queue="q", window=32)
    worker.report_cap(1200)
    assert worker.fill() == []  # the worker has read (and used) the large cap
    submitter.report_cap(3)
    granted = submitter.add("job", n=20, tenant="t", weight=1.0, priority="normal")
    assert sum(run.count for run in granted) == 3
    assert sum(run.count for run in worker.finished("job", 1)) == 1  # one place freed, one
    assert worker.defer("job", 1) == []  # waiting out a countdown still holds its place
    submitter.report_cap(6)  # the cap grew: the next grant (here, the pump's) fills to it
    assert sum(run.count for run in worker.fill()) == 3


# --- the window's accounting under takeovers, records, retries and kills --------------------

N_PARTS = 10
WORKERS = ("w1", "w2", "w3")


def test_the_windows_places_equal_the_parts_out_whatever_dies(redis_url, key_prefix):
    """A hypothesis state machine over the real scripts: the fair-share window (grants,
    defer, resume, records), the claims (receive, start, release, in either order), worker
    deaths and the recovery sweep (its dead-worker step and the window's repair). After every
    step the places the window counts out equal the parts it published that have no record;
    after every sweep the parts it counts as waiting out a countdown are exactly those that
    do; and once no worker dies any more, every part gets its record."""
    import uuid

    import hypothesis.strategies as st
    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import (
        RuleBasedStateMachine,
        invariant,
        precondition,
        rule,
        run_state_machine_as_test,
    )

    from drover.config import Settings
    from drover.workers.fairshare import FairShare
    from drover.workers.jobs.liveness import heartbeat_key, workers_key
    from drover.workers.jobs.records import SubagentResult
    from drover.workers.jobs.spec import JobSpec
    from drover.workers.jobs.store import JobStore
    from drover.workers.recovery import repair_windows, take_over_dead_workers

    r = redis.Redis.from_url(redis_url)

    class Window(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.prefix = f"{key_prefix}:{uuid.uuid4().hex[:6]}"
            self.settings = Settings(redis_url=redis_url, key_prefix=self.prefix, queue="q",
                                     dispatch_window=4, max_attempts=1000)
            self.store = JobStore(r, prefix=self.prefix, ttl_s=600)
            self.fs = FairShare.from_settings(r, self.settings, "q")
            self._schedulers = {"q": self.fs}.__getitem__  # the sweep's, from its root
            self.store.specs.create("J", JobSpec(subtasks=["x"] * N_PARTS), ["x"] * N_PARTS,
                                    status="running", queue="q")
            # part -> ("queued", token, is_retry) | ("held", worker, token) |
            #         ("running", worker, token) | ("done",)
            self.parts: dict[int, tuple] = {}
            self.alive = set(WORKERS)
            for w in WORKERS:
                r.set(heartbeat_key(self.prefix, w), "{}")
                r.zadd(workers_key(self.prefix), {w: 0})
            self._publish(self.fs.add("J", n=N_PARTS, tenant="t", weight=1, priority="normal"))

        def _publish(self, runs: list) -> None:
            for run in runs:
                for i in run.indices():
                    assert i not in self.parts, f"part {i} granted twice"
                    self.parts[i] = ("queued", 0, False)
            self.fs.published(runs)

        def _send(self, queue: str, job_id: str, part: object, token: int) -> None:
            if isinstance(part, int):
                self.parts[part] = ("queued", token, True)  # a re-send counts as a retry

        def _in(self, *states: str) -> list[int]:
            return sorted(i for i, p in self.parts.items() if p[0] in states)

        def _live(self, state: str) -> list[int]:
            """Parts in ``state`` on a live worker (a killed one does nothing more)."""
            return [i for i in self._in(state) if self.parts[i][1] in self.alive]

        # --- what the tasks do ----------------------------------------------------------
        @precondition(lambda self: self._in("queued") and self.alive)
        @rule(data=st.data())
        def deliver(self, data: st.DataObject) -> None:
            i = data.draw(st.sampled_from(self._in("queued")))
            worker = data.draw(st.sampled_from(sorted(self.alive)))
            _, token, retry = self.parts[i]
            if self.store.claims.receive("J", i, token, worker) != 1:
                return  # stale copy
            if retry:
                self._publish(self.fs.resume("J", i))
            new = int(self.store.claims.start("J", i, token, worker))
            assert new > 0
            self.parts[i] = ("running", worker, new)

        @precondition(lambda self: self._live("running"))
        @rule(data=st.data(), received_first=st.booleans())
        def countdown(self, data: st.DataObject, received_first: bool) -> None:
            i = data.draw(st.sampled_from(self._live("running")))
            _, worker, token = self.parts[i]
            self._publish(self.fs.defer("J", i))
            if received_first:  # the consumer takes the ETA message before the release
                self.store.claims.receive("J", i, token, worker)
                self.store.claims.release("J", i, token, worker)
            else:
                self.store.claims.release("J", i, token, worker)
                self.store.claims.receive("J", i, token, worker)
            self.parts[i] = ("held", worker, token)

        @precondition(lambda self: self._live("held"))
        @rule(data=st.data())
        def countdown_over(self, data: st.DataObject) -> None:
            i = data.draw(st.sampled_from(self._live("held")))
            _, worker, token = self.parts[i]
            self._publish(self.fs.resume("J", i))
            new = int(self.store.claims.start("J", i, token, worker))
            assert new > 0
            self.parts[i] = ("running", worker, new)

        @precondition(lambda self: self._live("running"))
        @rule(data=st.data())
        def record(self, data: st.DataObject) -> None:
            i = data.draw(st.sampled_from(self._live("running")))
            _, worker, token = self.parts[i]
            self.store.records.put(SubagentResult(job_id="J", index=i, status="ok", attempts=1,
                                                  finished_at=0.0), token=token, worker=worker)
            self.parts[i] = ("done",)
            self._publish(self.fs.finished("J", self.store.records.count("J")))

        # --- deaths and the sweep -------------------------------------------------------
        @precondition(lambda self: len(self.alive) > 1)
        @rule(data=st.data())
        def kill(self, data: st.DataObject) -> None:
            worker = data.draw(st.sampled_from(sorted(self.alive)))
            self.alive.discard(worker)
            r.delete(heartbeat_key(self.prefix, worker))

        @rule()
        def sweep(self) -> None:
            take_over_dead_workers(self.store, self.settings, self._send, self._schedulers)
            repair_windows(self.store, self.settings, self._send, self._schedulers)
            self._publish(self.fs.finished("J", self.store.records.count("J")))
            self._publish(self.fs.fill())
            share = {j.job_id: j for j in self.fs.jobs()}.get("J")
            if share is not None:
                # Deferred places: exactly the parts that wait out a countdown on a live worker.
                assert share.deferred == len(self._in("held")), (share, self.parts)

        @invariant()
        def places_equal_parts_out(self) -> None:
            share = {j.job_id: j for j in self.fs.jobs()}.get("J")
            out = self._in("queued", "held", "running")
            if share is None:
                assert not out and len(self._in("done")) == N_PARTS
                return
            assert share.dispatched == len(self.parts), (share, self.parts)
            assert share.out == len(out), (share, self.parts)
            assert 0 <= share.deferred <= share.out

        def teardown(self) -> None:
            # No more deaths: sweeps and deliveries end every part with one record each.
            for _ in range(20 * N_PARTS):
                if len(self._in("done")) == N_PARTS:
                    break
                self.sweep()
                for i in self._in("queued", "held", "running"):
                    state = self.parts[i]
                    if state[0] == "queued":
                        _, token, retry = state
                        worker = sorted(self.alive)[0]
                        if self.store.claims.receive("J", i, token, worker) == 1:
                            if retry:
                                self._publish(self.fs.resume("J", i))
                            token = int(self.store.claims.start("J", i, token, worker))
                            self.parts[i] = ("running", worker, token)
                    elif state[0] == "held" and state[1] in self.alive:
                        self._publish(self.fs.resume("J", i))
                        token = int(self.store.claims.start("J", i, state[2], state[1]))
                        self.parts[i] = ("running", state[1], token)
                    if self.parts[i][0] == "running" and self.parts[i][1] in self.alive:
                        _, worker, token = self.parts[i]
                        self.store.records.put(SubagentResult(
                            job_id="J", index=i, status="ok", attempts=1, finished_at=0.0),
                            token=token, worker=worker)
                        self.parts[i] = ("done",)
                        self._publish(self.fs.finished("J", self.store.records.count("J")))
            assert len(self._in("done")) == N_PARTS, self.parts
            assert self.store.records.count("J") == N_PARTS

    run_state_machine_as_test(Window, settings=settings(
        max_examples=30, stateful_step_count=40, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))


def test_calls_from_outside_the_fleet_share_the_line_by_tenant_and_hold_no_slot(
        redis_url, key_prefix):
    """The gateway's calls (``CallPlaces``) in a window of 4 slots and a line cap of 6: a
    call needs a place in the line only; a place a fleet sub-agent frees goes to the calls'
    tenant while it is below its due, one a call frees to the fleet's job (published by the
    calls' process); a call that leaves before its place gives it up; without a cap calls go
    at once; a process that is gone loses its places at the pump."""
    import asyncio

    import redis.asyncio

    from drover.config import Settings
    from drover.workers.fairshare import CallPlaces, FairShare, pump_once
    from drover.workers.jobs.store import JobStore

    settings = Settings(key_prefix=key_prefix, queue="calls-q", dispatch_window=4)
    r = redis.Redis.from_url(redis_url)
    fs = FairShare.from_settings(r, settings)
    fs.report_cap(6)
    assert [(d.job_id, d.count) for d in fs.add("big", n=100, tenant="fleet", weight=1,
                                                priority="normal")] == [("big", 4)]
    published: list = []

    def calls_of(tenant: str):  # noqa: ANN202
        return next(j for j in fs.jobs() if j.calls and j.tenant == tenant)

    async def scenario() -> None:
        places = CallPlaces(redis.asyncio.Redis.from_url(redis_url), settings, published.extend)
        await places.keep_alive()
        await places.enter("gw")  # the window's 4 slots are full, the line has 2 places
        await places.enter("gw")
        third = asyncio.ensure_future(places.enter("gw"))
        await asyncio.sleep(0.1)
        assert not third.done() and calls_of("gw").waiting == 1
        # A sub-agent ends: fleet 3 out, gw 2, due 3 each: the place is gw's.
        assert fs.finished("big", 1) == []
        await asyncio.wait_for(third, 5)
        assert (calls_of("gw").out, fs.jobs()[0].out) == (3, 3)
        # A call ends with none of gw's waiting: the fleet's job gets it, published here.
        await places.leave("gw")
        await asyncio.sleep(0.1)
        assert [(d.job_id, d.first, d.count) for d in published] == [("big", 4, 1)]
        # A call that leaves while waiting gives its turn up.
        fourth = asyncio.ensure_future(places.enter("gw"))
        await asyncio.sleep(0.1)
        fourth.cancel()
        await asyncio.gather(fourth, return_exceptions=True)
        assert calls_of("gw").waiting == 0
        # No cap: the key is not the bottleneck, a call goes at once.
        r.delete(fs.cap_key)
        for _ in range(5):
            await asyncio.wait_for(places.enter("web"), 5)
        assert calls_of("web").out == 5
        # The limiter's leases (12 in flight): 4 sub-agents running and 2 + 5 calls out hold
        # 11, so one more call goes and the next waits for a lease, not polls for one.
        fs.report_leases(12)
        await asyncio.wait_for(places.enter("web"), 5)
        twelfth = asyncio.ensure_future(places.enter("web"))
        await asyncio.sleep(0.1)
        assert not twelfth.done() and calls_of("web").waiting == 1
        await places.leave("gw")  # a call ends: its lease is the waiting call's
        await asyncio.wait_for(twelfth, 5)
        assert calls_of("web").out == 7 and calls_of("gw").out == 1
        # While calls are out, a sub-agent's place needs a lease too: with 11 leases a
        # sub-agent's end frees a slot but no lease (3 running and 8 calls out hold 11).
        fs.report_leases(11)
        assert fs.finished("big", 2) == []
        assert fs.jobs()[0].out == 3
        await places.r.aclose()

    asyncio.run(scenario())
    # The process is gone (its mark lapsed): the pump frees its places.
    r.delete(*r.keys(f"{fs.base}:alive:*"))
    store = JobStore(r, prefix=key_prefix, ttl_s=600)
    store.r.hset(store.keys.job("big", "meta"), mapping={"status": "running", "n": 100})
    pump_once(fs, store, published.extend)
    assert [j.job_id for j in fs.jobs()] == ["big"]
    fs.remove("big")
