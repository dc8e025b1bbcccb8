"""`python -m bench.batch` still runs end to end (a tiny workload), so the realtime-vs-batch
benchmark cannot rot unnoticed. It asserts what the harness produces, not how fast."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import ROOT


def test_bench_batch_runs_both_deliveries_and_writes_the_table(redis_url, tmp_path):  # noqa: ANN001
    out = tmp_path / "RESULTS-batch.md"
    env = {**os.environ, "DROVER_REDIS_URL": redis_url}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.batch", "--subagents", "4", "--workers", "1",
         "--concurrency", "2", "--batch-processing-s", "0.5", "--redis-url", redis_url,
         "--write", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line.split("|") for line in out.read_text().splitlines()
            if line.startswith(("| realtime", "| batch"))}
    assert rows["realtime"][4].strip() == "8 / 0" and rows["batch"][4].strip() == "0 / 8"
    assert "cost **0.50**" in out.read_text()
