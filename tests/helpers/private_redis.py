"""A redis-server of a test's own, which the test may kill and start again with its data."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from drover.orchestrator.ops.services import redis_answers
from tests.helpers import wait_until
from tests.helpers.ports import free_port

__all__ = ["PrivateRedis"]


class PrivateRedis:
    """A redis-server of this test's own on a fixed port, with an append-only file fsynced on
    every write, so it can be killed and started again with its data (like a production Redis
    with AOF)."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not on PATH")
        self.proc = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.workdir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
             "--logfile", str(self.workdir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(f"redis-server on port {self.port}", lambda: redis_answers(self.url), 20)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()  # SIGKILL: a crash, not a shutdown that saves
            self.proc.wait()
            self.proc = None
