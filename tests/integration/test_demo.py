"""`drover demo`, the main job, as a new user runs it: a subprocess with nothing prepared.

The demo runs against a redis-server this test starts (as if it were the user's own Redis at
DROVER_REDIS_URL), so the keys it leaves behind can be counted: none, or with ``--keep``
only keys that expire within the hour.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from drover.orchestrator.ops.services import RedisService, start_redis_server
from tests.helpers import ROOT
from tests.helpers.ports import free_port


@pytest.fixture
def own_redis() -> Iterator[RedisService]:
    try:
        service = start_redis_server()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    yield service
    service.close()


def _env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DROVER_", "COLUMNS"))}  # output is a pipe, no COLUMNS: wide
    env["PYTHONPATH"] = str(ROOT)
    env.update(values)
    return env


def _demo(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "drover.orchestrator.cli", "demo", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=400)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def _row(output: str, label: str) -> str:
    match = re.search(rf"{re.escape(label)}\s*│\s*([^│]+?)\s*│", output)
    assert match, f"no {label!r} row in:\n{output}"
    return match.group(1)


def _keys(url: str) -> dict[str, int]:
    """Each key and its TTL in milliseconds; a key that expired between the scan and its TTL
    (-2: the fair share's line cap lives 5 pump periods) is gone, so not listed. In
    milliseconds because TTL rounds to the nearest second: the cap read in its last half
    second showed 0, as if it never expired."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        ttls = {key: client.pttl(key) for key in client.scan_iter(count=1000)}
    finally:
        client.close()
    return {key: ttl for key, ttl in ttls.items() if ttl != -2}


def test_demo_runs_forty_subagents_and_leaves_nothing_in_a_redis_it_did_not_start(
        tmp_path, own_redis):
    proc = _demo(["--plot", str(tmp_path / "usage.png")],
                 _env(DROVER_REDIS_URL=own_redis.url), tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert f"using the Redis at {own_redis.url}" in out
    assert _row(out, "sub-agents ok") == "40"
    assert _row(out, "429s seen by the provider") == "0"
    assert int(_row(out, "cache reads (tokens)").replace(",", "")) > 0
    assert "Synthesis" in out and "simulated" in out
    assert (tmp_path / "usage.png").stat().st_size > 0

    # The result table and the stats table agree: the same definition, the same number.
    counted = _row(out, "input tokens against the limit (all calls)")
    stats_row = next(line for line in out.splitlines()
                     if re.match(r"│\s*(llm:demo:\S+)?\s*│ input tokens", line))
    assert stats_row.split("│")[-2].strip() == counted, stats_row  # the "window" column
    assert _row(out, "LLM calls (all calls)") == _row(out, "LLM calls seen by the provider")

    # Not a terminal: no table wraps mid-word (a scope name stays on one line).
    assert re.search(r"│ llm:demo:claude-sonnet-4-6\s+│ requests", out), out

    assert _keys(own_redis.url) == {}, "the demo left keys behind"


def test_demo_keep_leaves_only_keys_that_expire_within_the_hour(tmp_path, own_redis):
    proc = _demo(["--subagents", "4", "--no-plot", "--keep"],
                 _env(DROVER_REDIS_URL=own_redis.url), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    keys = _keys(own_redis.url)
    assert keys, "--keep kept nothing"
    assert any("_kombu.binding" in key for key in keys)  # kombu's, TTL-less by design
    assert any(key.endswith(":jobs") for key in keys)
    forever = {key: ttl for key, ttl in keys.items() if not 0 < ttl <= 3_600_000}
    assert not forever, forever
    assert "DROVER_KEY_PREFIX=drover-demo-" in proc.stdout.replace("\n", "")  # how to look


def test_demo_says_the_configured_redis_did_not_answer_then_falls_back_to_fakeredis(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    env = _env(PATH=str(bindir), DROVER_REDIS_URL=dead)
    proc = _demo(["--subagents", "6", "--no-plot"], env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = proc.stdout.find(f"no Redis answers at {dead} (DROVER_REDIS_URL)")
    assert said >= 0, proc.stdout
    assert "Connection refused" in proc.stdout
    assert said < proc.stdout.find("fakeredis")  # before it starts its own
    assert _row(proc.stdout, "sub-agents ok") == "6"
    assert "Connection to Redis lost" not in proc.stderr
    # Its heartbeat and metrics stop before its own Redis does (they used to retry against
    # it for a minute after the report, and say so).
    assert "Redis does not answer" not in proc.stderr, proc.stderr
    assert "metrics not flushed" not in proc.stderr, proc.stderr
    # Its in-process worker is alive when it submits (it reports no slots, sends no
    # worker_ready): submit's no-worker warning is not for it.
    assert "no worker serves it" not in proc.stderr, proc.stderr
