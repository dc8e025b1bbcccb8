"""`drover demo`, the main job, as a new user runs it: a subprocess with nothing prepared."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from orchestrator.services import free_port
from tests.conftest import ROOT


def _demo(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "demo", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=400)


def _row(output: str, label: str) -> str:
    match = re.search(rf"{re.escape(label)}\s*│\s*([^│]+?)\s*│", output)
    assert match, f"no {label!r} row in:\n{output}"
    return match.group(1)


def test_demo_runs_forty_subagents_with_planning_tools_synthesis_and_a_plot(tmp_path, redis_url):
    env = {**os.environ, "DROVER_REDIS_URL": redis_url, "COLUMNS": "200",
           "PYTHONPATH": str(ROOT)}
    proc = _demo(["--plot", str(tmp_path / "usage.png")], env, tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert _row(out, "sub-agents ok") == "40"
    assert _row(out, "429s seen by the provider") == "0"
    assert int(_row(out, "cache reads (tokens)").replace(",", "")) > 0
    assert "Synthesis" in out
    assert (tmp_path / "usage.png").stat().st_size > 0


def test_demo_falls_back_to_fakeredis_when_no_redis_server_is_installed(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    env = {**os.environ, "PATH": str(bindir), "DROVER_REDIS_URL": dead, "COLUMNS": "200",
           "PYTHONPATH": str(ROOT)}
    proc = _demo(["--subagents", "6", "--no-plot"], env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fakeredis" in proc.stdout
    assert _row(proc.stdout, "sub-agents ok") == "6"
    assert "Connection to Redis lost" not in proc.stderr
