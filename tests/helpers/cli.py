"""Running the ``drover`` command line as a user does, in an environment of the test's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

__all__ = ["BOUND_S", "clean_env", "drover"]


# Far above one connect attempt, below a retry loop (about 75 s). 30 s was exceeded by the
# command's own start beside a busy run (a bare `drover stats --help` took 44-53 s at load 15).
BOUND_S = 60


def clean_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DROVER_", "ANTHROPIC_", "FLOWER_", "COLUMNS"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update(values)
    return env


def drover(args: list[str], env: dict[str, str], cwd: Path, *, stdin: str | None = None,
           timeout: float = BOUND_S) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "drover.orchestrator.cli", *args], cwd=cwd,
                          env=env,
                          input=stdin, capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc
