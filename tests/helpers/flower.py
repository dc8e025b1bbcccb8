"""drover's Flower (``drover flower``) in a process of its own, for the tests that look at it."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from drover.orchestrator.ops.flower import (
    AUTH_ENV,
)
from tests.helpers import ROOT, wait_until
from tests.helpers.ports import free_port

__all__ = ["Flower", "SECRET", "running_flower"]


SECRET = "ACME-PRIVATE"  # in every prompt: it must never reach Flower


@dataclass
class Flower:
    url: str
    user: str
    password: str
    proc: subprocess.Popen
    log: Path

    def get(self, path: str, *, auth: bool = True) -> tuple[int, object]:
        request = urllib.request.Request(self.url + path)
        if auth:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                body = response.read().decode()
                status = response.status
        except urllib.error.HTTPError as error:
            return error.code, None
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body


@contextlib.contextmanager
def running_flower(drover_env: dict[str, str], log: Path, *, password: str | None
                   ) -> Iterator[Flower]:
    """``drover flower`` on a free loopback port; with basic auth from the environment when
    a password is given (on loopback drover does not require one)."""
    port = free_port()
    env = {**os.environ, **drover_env}
    env.pop(AUTH_ENV, None)
    if password is not None:
        env[AUTH_ENV] = f"drover:{password}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "drover.orchestrator.cli", "flower", f"--port={port}"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Flower(f"http://127.0.0.1:{port}", "drover", password or "", proc, log)
    try:
        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return server.get("/healthcheck", auth=False)[0] == 200
            except OSError:
                return False

        wait_until("Flower to answer", up)
        # Its event receiver must be connected before the job runs: events are not replayed.
        wait_until("Flower's event receiver", lambda: "Connected to" in log.read_text())
        yield server
    finally:
        # How Flower stops is not under test.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
