"""What the tests share besides their fixtures (``tests/conftest.py``): the repository's
root, waiting for a condition, stopping a process group, changing settings mid-test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

__all__ = ["DEFAULT_AMQP_HOST", "DEFAULT_AMQP_PORT", "EXAMPLES", "ROOT", "amqp_answers",
           "celery_app_target", "configure", "stop_process_group", "wait_for_workers", "wait_until"]

ROOT = Path(__file__).resolve().parents[2]
# Examples a property test runs: many in CI (where hypothesis also loads its "ci" profile,
# derandomised, so a run is repeatable), few in a developer's loop (pytest tests/unit).
EXAMPLES = 300 if os.environ.get("CI") else 40
DEFAULT_AMQP_HOST, DEFAULT_AMQP_PORT = "127.0.0.1", 5672


# The settings this process's Celery app is built from (config/celery.py): its connections.
# The app is built once, when first imported, from the settings of that moment, and kept for
# the rest of the process.
APP_CONNECTIONS = frozenset({"DROVER_REDIS_URL", "DROVER_BROKER_URL", "DROVER_RESULT_BACKEND",
                             "DROVER_KEY_PREFIX", "DROVER_SENTINEL_MASTER",
                             "DROVER_SENTINEL_PASSWORD"})


def configure(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], **values: object) -> None:
    """Change DROVER_* settings of the running test (before its workers start).

    A change of where the workers connect (a proxy, a private Redis, RabbitMQ) builds this
    process's Celery app first, from the test's settings before the change: an app first
    built under the change would keep pointing at a proxy or server the test closes, for
    every later test in the process (issue 53: the silent-connections test's ``wait()``
    asked for workers through it, and the next tests' pings met "Connection refused"). A
    test whose jobs must go through its own broker submits them from a process of its own
    (``tests.helpers.fleet.submit_elsewhere``)."""
    from drover.config import get_settings
    from drover.workers.agent.runtime import reset_runtime

    names = {key if key.startswith(("DROVER_", "ANTHROPIC_")) else f"DROVER_{key.upper()}": value
             for key, value in values.items()}
    if APP_CONNECTIONS & names.keys():
        import drover.workers.app  # noqa: F401  (built now, from the settings before the change)
    for name, value in names.items():
        env[name] = str(value)
        monkeypatch.setenv(name, str(value))
    get_settings.cache_clear()
    reset_runtime()


def celery_app_target() -> tuple[str, str, str] | None:
    """Where this process's Celery app publishes, stores results and keys its Redis entries
    (None before it is built)."""
    import sys

    module = sys.modules.get("drover.workers.tasklayer.app")
    if module is None:
        return None
    conf = module.app.conf
    prefix = (conf.broker_transport_options or {}).get("global_keyprefix", "")
    return (str(conf.broker_url), str(conf.result_backend), str(prefix))


def wait_until(what: str, check: Callable[[], object], timeout: float = 60.0) -> object:
    """Poll ``check`` until it returns something true; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def stop_process_group(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """SIGTERM a process started with start_new_session, SIGKILL it if it lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def amqp_answers(host: str = DEFAULT_AMQP_HOST, port: int = DEFAULT_AMQP_PORT) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def wait_for_workers(count: int, timeout: float = 90) -> None:
    """Until ``count`` worker processes answer a ping (so a job's clock starts with them up)."""
    from drover.workers.app import app

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(app.control.ping(timeout=0.5) or []) >= count:
            return
    raise AssertionError(f"{count} workers did not come up within {timeout} s")
