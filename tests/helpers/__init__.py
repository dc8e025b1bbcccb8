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
           "configure",
           "stop_process_group", "wait_for_workers", "wait_until"]

ROOT = Path(__file__).resolve().parents[2]
# Examples a property test runs: many in CI (where hypothesis also loads its "ci" profile,
# derandomised, so a run is repeatable), few in a developer's loop (pytest tests/unit).
EXAMPLES = 300 if os.environ.get("CI") else 40
DEFAULT_AMQP_HOST, DEFAULT_AMQP_PORT = "127.0.0.1", 5672


def configure(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], **values: object) -> None:
    """Change DROVER_* settings of the running test (before its workers start)."""
    from drover.config import get_settings
    from drover.workers.agent.runtime import reset_runtime

    for key, value in values.items():
        name = key if key.startswith(("DROVER_", "ANTHROPIC_")) else f"DROVER_{key.upper()}"
        env[name] = str(value)
        monkeypatch.setenv(name, str(value))
    get_settings.cache_clear()
    reset_runtime()


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
