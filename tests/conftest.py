"""Real services for the tests: Redis (the one at DROVER_REDIS_URL / 127.0.0.1:6379, or a
private redis-server on a free port), the simulator on a free port and real Celery workers.

Tests never flush a Redis they did not start: each test gets its own key prefix, and the
Celery broker uses a queue name of this test session's own.
"""

from __future__ import annotations

import logging
import os
import uuid
import warnings
from collections.abc import Iterator

import pytest
import redis

from drover.orchestrator.ops.services import RedisService, ensure_redis

DEFAULT_REDIS = os.environ.get("DROVER_REDIS_URL") or "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="session")
def redis_service() -> Iterator[RedisService]:
    service = ensure_redis(DEFAULT_REDIS)
    if service.kind == "fakeredis":
        service.close()
        pytest.exit("tests need a real Redis: install redis-server (Debian: apt-get install "
                    "redis-server) or set DROVER_REDIS_URL", returncode=3)
    yield service
    service.close()


@pytest.fixture(scope="session")
def redis_url(redis_service: RedisService) -> str:
    _SESSION_REDIS.append(redis_service.url)
    return redis_service.url


_SESSION_REDIS: list[str] = []  # the session's Redis, once a test has asked for it


@pytest.fixture
def key_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted afterwards (only its own)."""
    prefix = f"drovertest-{uuid.uuid4().hex[:10]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


# --- the simulator, drover's settings, and workers -----------------------------------------

import contextlib  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

from drover.simulator import SimConfig, SimulatorServer  # noqa: E402
from tests.helpers import (  # noqa: E402,F401  (the names older tests import from here)
    DEFAULT_AMQP_HOST,
    DEFAULT_AMQP_PORT,
    ROOT,
    amqp_answers,
    celery_app_target,
    configure,
    stop_process_group,
    wait_for_workers,
    wait_until,
    zygote,
)
from tests.helpers.gateway import GatewayProcess  # noqa: E402

SESSION = uuid.uuid4().hex[:8]
# Celery's keys (queues, results) use one prefix for the whole test session; every test gets
# its own queue, key alias (so its own limiter scope) and job ids, so tests cannot see each
# other's tasks or limits.
SESSION_PREFIX = f"drovertest-{SESSION}"


@pytest.fixture(scope="session", autouse=True)
def _session_keys(redis_url: str) -> Iterator[None]:
    yield
    # An in-process worker's heartbeat would write the registry ({prefix}:workers, kept for
    # days) again after the clean-up: stop it first.
    from drover.workers.services import stop_worker

    stop_worker()
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{SESSION_PREFIX}:*", count=1000):
        client.delete(key)
    client.close()


@pytest.fixture
def sim() -> Iterator[SimulatorServer]:
    """The simulator on a free port, generous limits unless a test configures tighter ones."""
    with SimulatorServer(SimConfig(seed=1, tool_turns=1, output_tokens_mean=60)) as server:
        yield server


@pytest.fixture
def drover_env(monkeypatch: pytest.MonkeyPatch, redis_url: str,
               sim: SimulatorServer) -> Iterator[dict[str, str]]:
    """DROVER_* variables for this test (also handed to worker subprocesses)."""
    from drover.config import get_settings
    from drover.workers.agent.runtime import reset_runtime

    test_id = uuid.uuid4().hex[:8]
    env = {
        "DROVER_REDIS_URL": redis_url,
        "DROVER_KEY_PREFIX": SESSION_PREFIX,
        "DROVER_QUEUE": f"q-{test_id}",
        "DROVER_KEY_ALIAS": f"t-{test_id}",
        "DROVER_ANTHROPIC_BASE_URL": sim.url,
        "ANTHROPIC_API_KEY": "sk-test-not-a-secret",
        "DROVER_RPM": "6000", "DROVER_ITPM": "10000000", "DROVER_OTPM": "10000000",
        "DROVER_BACKOFF_BASE_S": "0.2",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    _reset_runtime_loudly(reset_runtime)
    yield env
    _reset_runtime_loudly(reset_runtime)
    get_settings.cache_clear()


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _reset_runtime_loudly(reset_runtime) -> None:  # noqa: ANN001
    """A runtime whose loop did not shut down is a finding, not a passing detail: its
    warning (with where the loop's thread stood) goes to the session's warnings summary."""
    logger = logging.getLogger("drover.workers.agent.runtime")
    collect = _Collect()
    logger.addHandler(collect)
    try:
        reset_runtime()
    finally:
        logger.removeHandler(collect)
    for message in collect.messages:
        warnings.warn(message, stacklevel=2)


@pytest.fixture
def worker(drover_env: dict[str, str]) -> Callable[..., object]:
    """Start an in-process Celery worker (threads pool) on this test's queue."""
    from celery.contrib.testing.worker import start_worker

    from drover.config import get_settings
    from drover.workers.app import app
    from drover.workers.connections.preflight import import_tool_modules

    with contextlib.ExitStack() as stack:
        def start(concurrency: int = 8) -> object:
            settings = get_settings()
            # A `celery worker` imports DROVER_TOOL_MODULES when it is ready (its worker_ready
            # signal); celery's testing worker sends no such signal, so without this its
            # @tool and @subagent functions were registered only if an earlier test of the
            # process had imported them (test_own_subagents' CLI submit: "registered
            # sub-agents: none" when it ran first on its xdist worker).
            import_tool_modules(settings)
            return stack.enter_context(start_worker(
                app, pool="threads", concurrency=concurrency, perform_ping_check=False,
                loglevel="WARNING", queues=[settings.queue], shutdown_timeout=20))

        yield start


@pytest.fixture
def spawn_worker(drover_env: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen]]:
    """Start real worker processes (``celery -A drover.workers.app worker``) on this test's
    queue."""
    procs: list[subprocess.Popen] = []

    def spawn(concurrency: int = 8, pool: str = "threads", **extra_env: str) -> subprocess.Popen:
        env = {**os.environ, **drover_env, **extra_env}
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "drover.workers.app", "worker", "--pool", pool,
             "--concurrency", str(concurrency), "--queues", env["DROVER_QUEUE"],
             "--loglevel", "WARNING", "--without-gossip", "--without-mingle",
             "-n", f"w{len(procs)}-{uuid.uuid4().hex[:6]}@%h"],
            cwd=ROOT, env=env, start_new_session=True)
        procs.append(proc)
        return proc

    yield spawn
    # SIGKILL: how a worker shuts down is not what these tests prove (the tests that do
    # send their own SIGTERM), and a warm shutdown waits for calls in flight.
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()


@pytest.fixture
def gateway(drover_env: dict[str, str], tmp_path: Path
            ) -> Iterator[Callable[..., GatewayProcess]]:
    """Start real ``drover gateway`` processes on this test's settings (``DROVER_GATEWAY_KEYS``:
    tests.helpers.gateway.GATEWAY_KEYS unless given), each on a free port."""
    started: list[GatewayProcess] = []

    def start(**extra_env: str) -> GatewayProcess:
        process = GatewayProcess({**drover_env, **extra_env},
                                 tmp_path / f"gateway-{len(started)}.log")
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.stop()


# --- RabbitMQ as the broker (tests/system/test_worker_loss.py) -------------------------



@pytest.fixture(scope="session")
def rabbitmq_url() -> Iterator[str]:
    """A vhost of this test session's own on the RabbitMQ at 127.0.0.1:5672 (guest/guest),
    deleted afterwards; skips, saying why, when no RabbitMQ answers or rabbitmqctl fails."""
    import shutil

    if not amqp_answers():
        pytest.skip("no RabbitMQ answers on 127.0.0.1:5672 (.ci/run starts one; Debian: "
                    "apt-get install rabbitmq-server && rabbitmq-server -detached)")
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        pytest.skip("rabbitmqctl is not on PATH: cannot make a vhost of the tests' own")
    vhost = f"drovertest-{SESSION}"
    for argv in ([ctl, "add_vhost", vhost],
                 [ctl, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            pytest.skip(f"rabbitmqctl {argv[1]} failed: {done.stderr.strip()[:200]}")
    yield f"amqp://guest:guest@{DEFAULT_AMQP_HOST}:{DEFAULT_AMQP_PORT}/{vhost}"
    subprocess.run([ctl, "delete_vhost", vhost], capture_output=True, timeout=60)


@pytest.fixture
def sim_factory() -> Iterator[Callable[..., SimulatorServer]]:
    """Simulators of a test's own configuration (each stopped at the end)."""
    started: list[SimulatorServer] = []

    def make(**config: object) -> SimulatorServer:
        server = SimulatorServer(SimConfig(**config)).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


# --- Redis Sentinel: a master, a replica and three sentinels of the test's own ---------------

@pytest.fixture
def sentinel_set() -> Iterator[object]:
    """A Sentinel set on free ports (drover.orchestrator.ops.sentinels), stopped afterwards; skips,
    saying why, where redis-server is missing."""
    import shutil

    from drover.orchestrator.ops.sentinels import start_sentinel_set

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH, so no Sentinel set can start here (Debian: "
                    "apt-get install redis-server; .ci/run installs it)")
    cluster = start_sentinel_set()
    yield cluster
    cluster.close()


@pytest.fixture(autouse=True)
def _celery_app_left_as_found() -> Iterator[None]:
    """Each test leaves this process's Celery app where it found it: built once per process
    and kept, an app left pointing at a test's proxy, private Redis or RabbitMQ vhost fails
    every later test of the process that pings, cancels or submits ("Connection refused",
    or messages no worker reads). The test that moved it errors here, by name."""
    before = celery_app_target()
    yield
    after = celery_app_target()
    want = before or (_SESSION_REDIS and (_SESSION_REDIS[0], _SESSION_REDIS[0],
                                          f"{SESSION_PREFIX}:celery:"))
    if after is not None and want and after != want:
        pytest.fail(f"this test left the process's Celery app (broker, result backend, key "
                    f"prefix) at {after}, not {want}: later tests here would use it. Change "
                    f"where workers connect with tests.helpers.configure (it builds the app "
                    f"first), and submit through the test's own broker with submit_elsewhere",
                    pytrace=False)


# --- a failure says what failed at once ---------------------------------------------------

def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Print a failure's details the moment it happens (in the run's controller process,
    where pytest-xdist's workers report), not only in the summary at the end: the first
    failure of a long run is readable while the rest still runs, and comes first in the
    output."""
    if not report.failed:
        return
    config = _CONFIG.get("config")
    if config is None or hasattr(config, "workerinput"):  # a worker: its controller prints it
        return
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    if terminal is None:
        return
    where = {"setup": "at setup", "call": "", "teardown": "at teardown"}[report.when]
    terminal.write_line("")
    terminal.write_sep("!", f"FAILED {report.nodeid} {where}".rstrip(), red=True)
    terminal.write_line(str(report.longrepr))
    terminal.write_sep("!", "(the run goes on)", red=True)


_CONFIG: dict[str, pytest.Config] = {}

# --- the longest tests first ----------------------------------------------------------------

# Files whose tests take a minute or more each on a loaded 2-core box (--durations).
LONG_POLES = ("tests/system/test_worker_loss.py", "tests/system/test_first_hour.py",
              "tests/system/test_limiter_e2e.py", "tests/integration/test_bench_smoke.py",
              "tests/system/test_wait_in_line.py", "tests/system/test_silent_connections.py",
              "tests/system/test_long_answers.py",
              # a minute or more on a loaded box, though they sort late by tier: the
              # property test's 300 examples under CI, the docs' blocks, the batch bench
              "tests/unit/test_limiter_model.py", "tests/integration/test_docs.py",
              "tests/integration/test_batches_bench.py", "tests/system/test_prometheus.py")
TIERS = ("tests/system/", "tests/integration/", "tests/unit/")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the long tests first: pytest-xdist hands tests out in this order, so a minute-long
    test collected last (the system tier sorts last by name) would run alone at the end while
    the other processes idle. The order is the same in every process (xdist checks)."""
    def rank(item: pytest.Item) -> tuple[int, int]:
        path = item.nodeid.split("::", 1)[0]
        tier = next((i for i, prefix in enumerate(TIERS) if path.startswith(prefix)),
                    len(TIERS))
        return (0 if path in LONG_POLES else 1, tier)

    items.sort(key=rank)  # stable: within a rank, the order of collection
    # Importing the Celery app configures it from the settings of that moment, for the rest
    # of the process: at collection those are the defaults (key prefix "drover"), so pings
    # and publishes would miss every worker of the session (CI of 18131c0: 25 failed).
    if "drover.workers.tasklayer.app" in sys.modules:
        raise pytest.UsageError("a test module imports drover.workers.app (or tasklayer.app) "
                                "at collection: import it inside the test")


# --- five test processes by default -------------------------------------------------------

WORKERS = 5  # most tests wait (latency, limits, sweeps): five share two cores well


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """``-n 5 --dist loadgroup`` unless the command line says ``-n`` itself (``-n 0``: one
    process). Here rather than in pyproject's addopts so that a checkout whose environment
    has not installed the test extra's pytest-xdist yet still runs its tests (in one
    process) instead of refusing ``-n``. Runs before xdist's own hook, which reads these."""
    if hasattr(config, "workerinput") or getattr(config.option, "numprocesses", 0) is not None:
        return
    if config.option.collectonly:
        return
    config.option.numprocesses = WORKERS
    if config.option.dist == "no":
        config.option.dist = "loadgroup"


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG["config"] = config
    if _runs_tests(config):
        zygote.install()  # drover's worker and CLI processes fork from a pre-imported Python


def pytest_unconfigure(config: pytest.Config) -> None:
    zygote.uninstall()


def _runs_tests(config: pytest.Config) -> bool:
    """This process runs tests: an xdist worker, or the only process (``-n 0``)."""
    return hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)
