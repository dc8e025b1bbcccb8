"""An operator's view: Flower's tasks page, opened in headless Chromium (Debian's
``chromium``), shows a job's failed sub-agent as a row with its job, its index and its status.

The page fills its table from ``/tasks/datatable`` with JavaScript, so the DOM is dumped after
a virtual time budget that lets those requests finish. Flower runs on loopback without a
password here (drover requires one only beyond loopback), so no credential goes on
Chromium's command line.
"""

from __future__ import annotations

import html
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from drover import JobSpec, submit
from tests.helpers import wait_until
from tests.helpers.flower import SECRET, running_flower

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (apt-get install -y chromium); it is not "
    "installed here")


def dump_dom(url: str, profile: Path) -> str:
    """The page's DOM after its scripts ran, as headless Chromium serialises it."""
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
         "--virtual-time-budget=15000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def rows(dom: str) -> list[str]:
    """Each table row of the tasks table, as its cells' text joined by ' | '."""
    table = dom.split('id="tasks-table"', 1)[1]
    found = []
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, flags=re.S):
        cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
                 for c in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]
        if cells:
            found.append(" | ".join(cells))
    return found


def test_the_tasks_page_shows_the_jobs_failed_subagent_row(drover_env, sim, spawn_worker,
                                                           tmp_path):
    with running_flower(drover_env, tmp_path / "flower.log", password=None) as flower:
        worker = spawn_worker(concurrency=2)
        handle = submit(JobSpec(subtasks=[f"{SECRET} survey A", f"{SECRET} survey B "
                                          "[[sim:400]]"], max_tokens=80))
        assert [r.status for r in handle.wait(timeout=90).results] == ["ok", "failed"]

        def finished() -> bool:
            # What the page's table asks for (Flower's /api needs a password configured).
            status, page = flower.get("/tasks/datatable?draw=1&start=0&length=15"
                                      "&order[0][column]=0&columns[0][data]=name"
                                      "&search[value]=args:job=" + handle.id, auth=False)
            assert status == 200, status
            return sum(t["state"] == "SUCCESS" for t in page["data"]) == 3

        wait_until("the job's tasks in Flower", finished)
        worker.send_signal(signal.SIGKILL)  # how it stops is not under test

        dom = dump_dom(f"{flower.url}/tasks?name=drover.run_subagent", tmp_path / "chromium")
    table = rows(dom)
    failed = [r for r in table if f"sub=1/2 job={handle.id}" in r]
    assert len(failed) == 1, table
    (row,) = failed
    assert "drover.run_subagent" in row and "SUCCESS" in row
    assert "{'status': 'failed', 'error': '400 invalid_request_error" in row
    ok = [r for r in table if f"sub=0/2 job={handle.id}" in r]
    assert len(ok) == 1 and "{'status': 'ok'" in ok[0]
    assert SECRET not in dom
