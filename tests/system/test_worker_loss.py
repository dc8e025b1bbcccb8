"""A lost worker costs seconds: real worker processes, DEFAULT recovery settings (no short
visibility timeout), on the Redis broker and on RabbitMQ.

Each worker process keeps a heartbeat in Redis; each part of a running job (a sub-agent, the
join, the planning task) that a worker holds carries a claim with a fencing token; the sweep
on a live worker re-sends a dead worker's parts once its heartbeat has expired
(DROVER_HEARTBEAT_TTL_S, 10 s by default). The tests print how long recovery took.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from drover import JobSpec
from drover.simulator import SimConfig, SimulatorServer
from tests.helpers import amqp_answers, configure, wait_until
from tests.helpers.fleet import Fleet, assert_complete, kill_group, submit_elsewhere
from tests.helpers.ports import free_port

THREADS = 16
SIM = {"overload_rate": 0.3, "latency_mean_s": 0.5, "latency_p95_s": 1.0,
       "output_tokens_mean": 20, "tool_turns": 2, "tools_per_turn": 1}
CALLS = 3  # per sub-agent with tool_turns=2: two tool turns and the answer


@pytest.fixture(params=["redis", "rabbitmq"])
def broker(request: pytest.FixtureRequest, drover_env: dict[str, str],
           monkeypatch: pytest.MonkeyPatch) -> str:
    """The broker of this test run: the test Redis, or a vhost of our own on RabbitMQ."""
    if request.param == "rabbitmq":
        configure(monkeypatch, drover_env, broker_url=request.getfixturevalue("rabbitmq_url"))
    return request.param


def default_settings(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    # Recovery settings stay at their defaults. Attempts count every failed call of a
    # sub-agent (three calls each at 30% 529s): 15 makes a sub-agent drawing that many
    # failures negligibly rare (the default 8 fails about one job in ten at this fault rate);
    # a countdown cap of 5 s keeps one unlucky sub-agent's backoff from outlasting the test.
    # Neither is a recovery setting. The fair-share window is the default (the workers'
    # slots): the killed worker takes places of the window with it (sub-agents deferred in a
    # countdown, grants not yet published), which recovery must give back.
    configure(monkeypatch, env, max_attempts=15, countdown_cap_s=5)


@pytest.fixture
def fleet(drover_env: dict[str, str]) -> Iterator[Fleet]:
    f = Fleet(drover_env)
    yield f
    f.close()


def test_a_worker_killed_mid_job_costs_seconds(broker, sim, drover_env, spawn_worker,
                                               monkeypatch, fleet):
    default_settings(monkeypatch, drover_env)
    sim.configure(**SIM)
    # Queued first, so the job cannot be half done before the workers are up.
    handle = submit_elsewhere(drover_env, JobSpec(
        subtasks=[f"Inspect pier {i}" for i in range(100)], tools=["lookup_fact"],
        max_tokens=60))
    victim = spawn_worker(concurrency=THREADS)
    survivor = spawn_worker(concurrency=THREADS)
    victim_id, _ = fleet.wait_for(victim, survivor)
    wait_until("the job under way and the victim busy", lambda: handle.progress()["ok"] >= 5
               and len(fleet.held(victim_id)) >= 8, 120)

    in_flight = sim.stats()["in_flight"]  # both workers' calls: a bound on the victim's
    held = fleet.held(victim_id)
    kill_group(victim)  # SIGKILL: no shutdown, no acks
    killed = time.monotonic()
    victim.wait()
    assert held, "the kill came mid-job"
    wait_until("the killed worker's sub-agents resumed elsewhere",
               lambda: all(fleet.moved_on(job, part, victim_id) for job, part in held), 60)
    resumed_s = time.monotonic() - killed
    result = fleet.wait(handle, 100, timeout=60)
    done_s = time.monotonic() - killed
    print(f"\n[{broker}] kill -9 of a worker holding {len(held)} sub-agents: all resumed "
          f"elsewhere {resumed_s:.1f} s after the kill; job done {done_s:.1f} s after it "
          f"(duplicates {sim.stats()['duplicate_accepted']}, in flight at the kill {in_flight})")

    assert_complete(result, fleet, 100)
    stats = sim.stats()
    # Resumed from checkpoints: only calls in flight at the kill can have been sent twice.
    assert stats["duplicate_accepted"] <= in_flight
    assert stats["accepted"] - stats["duplicate_accepted"] == result.usage.calls == 100 * CALLS


def test_a_paused_worker_is_resumed_elsewhere_and_calls_nothing_when_it_wakes(
        sim, drover_env, spawn_worker, monkeypatch, fleet):
    default_settings(monkeypatch, drover_env)
    sim.configure(**{**SIM, "overload_rate": 0.0})
    # The paused worker talks to a simulator of its own, so every call it makes is counted
    # apart; both simulators answer a conversation alike (same seed).
    with SimulatorServer(SimConfig(seed=1, **{**SIM, "overload_rate": 0.0})) as own:
        handle = submit_elsewhere(drover_env, JobSpec(
            subtasks=[f"Count containers {i}" for i in range(40)], tools=["lookup_fact"],
            max_tokens=60))
        victim = spawn_worker(concurrency=THREADS, DROVER_ANTHROPIC_BASE_URL=own.url)
        survivor = spawn_worker(concurrency=THREADS)
        victim_id, _ = fleet.wait_for(victim, survivor)
        wait_until("the victim running sub-agents", lambda: len(fleet.running(victim_id)) >= 4,
                   60)
        held = fleet.held(victim_id)
        kill_group(victim, signal.SIGSTOP)  # a partition: alive, but silent
        stopped = time.monotonic()
        running = fleet.running(victim_id)  # its claims cannot change while it is stopped
        time.sleep(2.0)  # the calls it had sent reach the simulator
        calls_before = own.stats()["accepted"]
        wait_until("its sub-agents resumed elsewhere",
                   lambda: all(fleet.moved_on(job, part, victim_id) for job, part in held), 60)
        print(f"\npaused worker's {len(held)} sub-agents resumed elsewhere "
              f"{time.monotonic() - stopped:.1f} s after SIGSTOP")
        result = fleet.wait(handle, 40, timeout=60)

        kill_group(victim, signal.SIGCONT)
        time.sleep(6.0)  # its replies land, its held messages run: each finds a newer claim
        assert victim.poll() is None  # it woke up and carried on
        # And started no call for them: every call it makes after waking stops at its check
        # of the claim (after the limiter's wait, right before the send). What can still
        # reach the simulator late is a request it had begun to send when it was stopped (a
        # process stopped before its event loop wrote the bytes writes them when it wakes):
        # at most one per sub-agent that was running on it.
        late = own.stats()["accepted"] - calls_before
        print(f"calls of the woken worker that reached the simulator after the pause: {late} "
              f"(sub-agents running on it at the pause: {len(running)})")
        assert late <= len(running)
        assert_complete(result, fleet, 40)
        stats = sim.stats()
        assert stats["duplicate_accepted"] == 0
        assert stats["accepted"] + calls_before - own.stats()["duplicate_accepted"] >= \
            result.usage.calls
        kill_group(victim)


def test_sigterm_hands_a_busy_workers_sub_agents_back_at_once(sim, drover_env, spawn_worker,
                                                              monkeypatch, fleet):
    default_settings(monkeypatch, drover_env)
    sim.configure(**{**SIM, "overload_rate": 0.0})
    handle = submit_elsewhere(drover_env, JobSpec(
        subtasks=[f"Check manifest {i}" for i in range(60)], tools=["lookup_fact"],
        max_tokens=60))
    victim = spawn_worker(concurrency=THREADS)
    survivor = spawn_worker(concurrency=THREADS)
    victim_id, _ = fleet.wait_for(victim, survivor)
    wait_until("the victim running sub-agents", lambda: len(fleet.running(victim_id)) >= 4, 60)

    held = fleet.held(victim_id)
    os.kill(victim.pid, signal.SIGTERM)  # what docker stop and Kubernetes send
    signalled = time.monotonic()
    wait_until("its sub-agents continuing on the other worker",
               lambda: all(fleet.moved_on(job, part, victim_id) for job, part in held), 30)
    moved_s = time.monotonic() - signalled
    victim.wait(timeout=30)  # it exits within its grace
    exited_s = time.monotonic() - signalled
    result = fleet.wait(handle, 60, timeout=60)
    print(f"\nSIGTERM: {len(held)} sub-agents continued elsewhere {moved_s:.1f} s after it; "
          f"the worker exited after {exited_s:.1f} s")

    assert victim.returncode == 0  # a warm shutdown, not a crash
    assert_complete(result, fleet, 60)
    stats = sim.stats()
    assert stats["duplicate_accepted"] == 0  # the calls in flight finished: nothing repeated
    assert stats["accepted"] == result.usage.calls == 60 * CALLS


# --- RabbitMQ restarted under a running job ------------------------------------------------

class PrivateRabbit:
    """A rabbitmq-server of this test's own (own node name, port and data directory), so it
    can be stopped and started again without disturbing the shared one."""

    def __init__(self, workdir: Path):
        self.port, self.dist_port = free_port(), free_port()
        self.node = f"drovertest{self.port}@localhost"
        self.workdir = workdir
        (workdir / "mnesia").mkdir()
        (workdir / "log").mkdir()
        (workdir / "enabled_plugins").write_text("[].\n")
        (workdir / "rabbitmq.conf").write_text(f"listeners.tcp.default = {self.port}\n")
        # Debian's rabbitmq-server drops to the rabbitmq user when started as root.
        with contextlib.suppress(LookupError, PermissionError):
            for path in [workdir, *workdir.rglob("*")]:
                shutil.chown(path, "rabbitmq")
        self.env = {**os.environ, "RABBITMQ_NODENAME": self.node,
                    "RABBITMQ_NODE_PORT": str(self.port), "RABBITMQ_DIST_PORT": str(
                        self.dist_port),
                    "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
                    "RABBITMQ_LOG_BASE": str(workdir / "log"),
                    "RABBITMQ_ENABLED_PLUGINS_FILE": str(workdir / "enabled_plugins"),
                    "RABBITMQ_CONFIG_FILE": str(workdir / "rabbitmq.conf")}
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        binary = shutil.which("rabbitmq-server")
        if binary is None:
            pytest.skip("rabbitmq-server is not on PATH (Debian: apt-get install "
                        "rabbitmq-server)")
        self.proc = subprocess.Popen([binary], env=self.env, cwd=self.workdir,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + 90
        while not amqp_answers("127.0.0.1", self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"a private rabbitmq-server did not start (see {self.workdir})")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # a clean restart, as an upgrade does
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self.proc = None
        # Started as root, Debian's script runs the node as the rabbitmq user in a session
        # of its own, out of our process group: find it by the node name in its environment.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            beams = self._beams()
            for pid in beams:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 30
            while beams and self._beams() and time.monotonic() < deadline:
                time.sleep(0.2)

    def _beams(self) -> list[int]:
        mark = f"RABBITMQ_NODENAME={self.node}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if mark in (entry / "environ").read_bytes().split(b"\0"):
                        found.append(int(entry.name))
        return found


@pytest.fixture
def private_rabbit() -> Iterator[PrivateRabbit]:
    # Not pytest's tmp_path: the rabbitmq user cannot enter root's pytest directory.
    workdir = Path(tempfile.mkdtemp(prefix="drovertest-rabbit-"))
    server = PrivateRabbit(workdir)
    try:
        server.start()
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_rabbitmq_restarted_mid_job_loses_nothing(sim, drover_env, spawn_worker, monkeypatch,
                                                  fleet, private_rabbit):
    default_settings(monkeypatch, drover_env)
    configure(monkeypatch, drover_env, broker_url=private_rabbit.url)
    sim.configure(**SIM)
    handle = submit_elsewhere(drover_env, JobSpec(
        subtasks=[f"Inspect crane {i}" for i in range(100)], tools=["lookup_fact"],
        max_tokens=60))
    workers = [spawn_worker(concurrency=THREADS) for _ in range(2)]
    fleet.wait_for(*workers)
    wait_until("10 sub-agents done", lambda: handle.progress()["ok"] >= 10, 120)
    private_rabbit.stop()
    # Away for longer than kombu's connect timeout (4 s): a retry sent meanwhile can fail
    # outright (the next test shows what then), and the workers must ride the outage out.
    time.sleep(8)
    private_rabbit.start()
    result = fleet.wait(handle, 100, timeout=120)

    assert_complete(result, fleet, 100)
    stats = sim.stats()
    assert stats["accepted"] - stats["duplicate_accepted"] == result.usage.calls == 100 * CALLS


def test_a_retry_sent_while_rabbitmq_is_down_waits_for_it(drover_env, monkeypatch,
                                                          private_rabbit):
    """Celery rejects a delivery whose retry it cannot publish (``Task.retry`` turns the
    error into ``Reject``), and kombu gives up on a broker that is down outright within its
    connect timeout (4 s) whatever the publish retry policy says: the part would stay
    "running" on a live worker, its job's chord failed. drover's retry waits for the broker."""
    from celery import Celery
    from celery.exceptions import Retry

    from drover.config import get_settings
    from drover.config.celery import celery_config
    from drover.workers.agent import LimiterSaysLater
    from drover.workers.tasklayer._delivery import retry

    configure(monkeypatch, drover_env, broker_url=private_rabbit.url)
    app = Celery("drover-retry-test", set_as_current=False)
    app.conf.update(celery_config(get_settings()))
    queue = f"{drover_env['DROVER_QUEUE']}-retry"

    @app.task(bind=True, name="drover.test_retry_target")
    def target(self: object) -> None:
        """Only its retry is published here."""

    outcome: list[object] = []

    def send() -> None:
        # As a worker's thread runs it (a task's request is the thread's own).
        target.push_request(id="retry-test", args=[], kwargs={}, retries=0, headers={},
                            called_directly=False,
                            delivery_info={"exchange": "", "routing_key": queue})
        try:
            outcome.append(retry(target, LimiterSaysLater(0.0, "a test retry")))
        except BaseException as error:  # what the old code raised: Reject
            outcome.append(error)

    private_rabbit.stop()
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    time.sleep(6)  # past kombu's connect timeout: the first tries fail outright
    assert not outcome, f"the retry ended while the broker was down: {outcome!r}"
    private_rabbit.start()
    sender.join(timeout=120)

    assert outcome and isinstance(outcome[0], Retry), outcome
    with app.connection_for_read() as conn:
        message = wait_until("the retry's message on the queue",
                             lambda: conn.default_channel.basic_get(queue=queue, no_ack=True),
                             30)
    assert message.headers["task"] == "drover.test_retry_target"


# --- kill -9 under tight limits, with the default window ------------------------------------

TIGHT_RPM = 100  # two workers of 16 slots are more than the 25 calls 15 s serve
TIGHT_N = 40


def limiter_cooldown_s(env: dict[str, str]) -> float:
    """Seconds left of the test key's cooldown (0 when none), as the limiter holds it."""
    from drover.workers.limiter import Limiter

    limiter = Limiter(redis.Redis.from_url(env["DROVER_REDIS_URL"]),
                      prefix=env["DROVER_KEY_PREFIX"])
    scopes = [s for s in limiter.scopes() if env["DROVER_KEY_ALIAS"] in s]
    return max((limiter.state(s)["cooldown_s"] for s in scopes), default=0.0)


@pytest.mark.parametrize(("moment", "broker_name"), [
    ("early", "redis"), ("middle", "redis"), ("cooldown", "redis"),
    ("middle", "rabbitmq"), ("cooldown", "rabbitmq")])
def test_kill_under_tight_limits_with_the_default_window_leaves_no_part_behind(
        moment, broker_name, sim, drover_env, spawn_worker, monkeypatch, fleet, request):
    """kill -9 of one of two workers while the key is the bottleneck (100 RPM, 40 one-call
    sub-agents, 32 worker slots: most sub-agents wait for the limiter at any moment), with
    the default dispatch window, early in the job, in its middle, or while a 429's
    retry-after (20 s, past the horizon) holds every worker in a cooldown. Every part the
    dead worker held (running, prefetched, waiting in a countdown, deferred in the window)
    comes back: the job ends with every sub-agent ok, each recorded once, and the window's
    places are all handed back. (At 60 RPM before: the key is as much the bottleneck at 100,
whose 15 s horizon serves 25 of the 32 slots, and the job is over in 24 s, not 40 s.)"""
    if broker_name == "rabbitmq":
        configure(monkeypatch, drover_env, broker_url=request.getfixturevalue("rabbitmq_url"))
    configure(monkeypatch, drover_env, rpm=TIGHT_RPM, max_attempts=15, countdown_cap_s=25)
    sim.configure(rpm=TIGHT_RPM, burst_s=1.0, tool_turns=0, output_tokens_mean=20,
                  latency_mean_s=0.3, latency_p95_s=0.6,
                  inject_429_rate=0.08 if moment == "cooldown" else 0.0,
                  inject_429_retry_after=20)
    handle = submit_elsewhere(drover_env, JobSpec(
        subtasks=[f"Weigh container {i}" for i in range(TIGHT_N)], max_tokens=40))
    victim = spawn_worker(concurrency=THREADS)
    survivor = spawn_worker(concurrency=THREADS)
    victim_id, _ = fleet.wait_for(victim, survivor)
    if moment == "early":
        wait_until("the victim holding sub-agents", lambda: len(fleet.held(victim_id)) >= 3,
                   120)
    elif moment == "middle":
        wait_until("half the job done", lambda: handle.progress()["ok"] >= TIGHT_N // 2 and
                   fleet.held(victim_id), 180)
    else:
        wait_until("a cooldown under way", lambda: limiter_cooldown_s(drover_env) > 8 and
                   fleet.held(victim_id), 180)
    held = fleet.held(victim_id)
    done_at_kill = handle.progress()["ok"]
    kill_group(victim)
    killed = time.monotonic()
    victim.wait()
    result = fleet.wait(handle, TIGHT_N, timeout=240)
    done_s = time.monotonic() - killed
    fs_left = fleet.r.hgetall(f"{fleet.prefix}:fs:{{{drover_env['DROVER_QUEUE']}}}:jobs")
    print(f"\n[{broker_name}, {moment}] kill -9 of a worker holding {len(held)} parts at "
          f"{done_at_kill}/{TIGHT_N} done: the last record {done_s:.1f} s after the kill "
          f"(429s {sim.stats().get('rejected_429', '?')})")
    assert_complete(result, fleet, TIGHT_N)
    assert handle.id not in fs_left, f"the window still holds the job: {fs_left}"
