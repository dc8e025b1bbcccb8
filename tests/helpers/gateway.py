"""``drover gateway`` as a real process of a test's own, and the keys its callers use."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.helpers import ROOT, stop_process_group, wait_until
from tests.helpers.ports import free_port

__all__ = ["GATEWAY_KEYS", "GatewayProcess", "fingerprint", "gateway_keys_env"]

# Two callers of two tenants (test values, not secrets).
GATEWAY_KEYS = {"web": "dgw-test-web-0123456789abcdef", "batch": "dgw-test-batch-0123456789ab"}


def gateway_keys_env(**budgets: dict[str, float]) -> str:
    """DROVER_GATEWAY_KEYS for GATEWAY_KEYS (``budgets``: tenant -> its budget)."""
    return json.dumps([{"key": key, "tenant": tenant, **({"budget": budgets[tenant]}
                                                         if tenant in budgets else {})}
                       for tenant, key in GATEWAY_KEYS.items()])


def fingerprint(key: str) -> str:
    """How the simulator's ``keys_seen`` names a key it was sent."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


class GatewayProcess:
    """``drover gateway`` on a free port, its stderr in ``log``; a context manager."""

    def __init__(self, env: dict[str, str], log: Path, *, verbose: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.env = {**os.environ, **env}
        self.env.setdefault("DROVER_GATEWAY_KEYS", gateway_keys_env())
        self.verbose = verbose
        self.proc: subprocess.Popen | None = None

    def start(self) -> GatewayProcess:
        args = [sys.executable, "-m", "drover.orchestrator.cli", "gateway", "--port",
                str(self.port)] + (["--verbose"] if self.verbose else [])
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(args, cwd=ROOT, env=self.env, stdout=out, stderr=out,
                                         start_new_session=True)
        wait_until(f"drover gateway on port {self.port} (log: {self.log})", self._up, 60)
        return self

    def _up(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"drover gateway exited {self.proc.returncode}: "
                                 f"{self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def healthy(self) -> bool:
        """What its /health says: True while its Redis answers."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as answer:
                return answer.status == 200
        except OSError:  # urllib's HTTPError (a 503) is one too
            return False

    def kill(self) -> None:
        """SIGKILL (a process whose Redis is gone would spend its exit retrying a flush)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc)
            self.proc = None

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
