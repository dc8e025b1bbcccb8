"""The docs' "Write your own tools and jobs" (docs/jobs.md) and "By hand" on several hosts
(docs/deployment.md), followed word for word in new folders, as a new user would (issue 29's
"Done when"; the README had both sections then).

The files and commands are read out of the pages themselves, so the test breaks when they
stop working. The only changes are the ones a single test machine needs: a Redis of the
test's own on a free port (the README's own ``redis-server`` command, on loopback), free
ports for the simulator, loopback for the hosts' address ``10.0.0.5``, and the job id that
``drover submit`` printed where the README writes ``JOB_ID``. The commands run in ``bash``
from the new folder with the installed ``drover`` and ``python`` first on PATH, nothing on
PYTHONPATH and no DROVER_*/ANTHROPIC_* setting the README does not set.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.helpers import ROOT
from tests.helpers.ports import free_port

BOUND_S = 400  # the whole walk-through, generously (the jobs run at 50 requests a minute)


def drover_script() -> str:
    """The installed ``drover`` command of this interpreter."""
    beside = Path(sys.executable).parent / "drover"
    found = str(beside) if beside.exists() else shutil.which("drover")
    assert found, "no `drover` console script: install drover (pip install -e .)"
    return found


def section(page: str, title: str) -> str:
    text = (ROOT / "docs" / page).read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"```(\w*)\n(.*?)```", text, re.S)


def shell_env(tmp_path: Path, **values: str) -> dict[str, str]:
    """A user's shell: `drover` and `python` of this install first on PATH, nothing else."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, target in (("python", sys.executable), ("drover", drover_script())):
        link = bin_dir / name
        if not link.exists():
            link.symlink_to(target)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DROVER_", "ANTHROPIC_", "COLUMNS", "PYTHONPATH"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env.update(values)
    return env


def end_group(leader: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM every process the script left running (the simulator, the workers), then
    SIGKILL what lingers. The group's leader is our child: reaped here as soon as it ends
    (a zombie still counts as a member of its group, so an unreaped leader kept the group
    alive for the whole timeout: 30 s of every test's call and of its teardown)."""
    pgid = leader.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader.poll()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def run_script(script: str, cwd: Path, env: dict[str, str], log: Path) -> int:
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return proc.wait(timeout=BOUND_S)
    finally:
        end_group(proc)
        proc.wait()


@pytest.fixture
def readme_redis(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """Step 1 of deployment's "By hand", on loopback and a free port: (port, password)."""
    command = section("deployment.md", "By hand").split("**1. Redis**")[1]
    (_, line), = [b for b in blocks(command)[:1]]
    line = line.strip()
    assert line == ("redis-server --bind 0.0.0.0 --requirepass 'redis-password' --save \"\" "
                    "--appendonly no"), line
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH (Debian: apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen(["bash", "-c", line.replace("--bind 0.0.0.0", "--bind 127.0.0.1")
                             + f" --port {port} --dir {tmp_path}"],
                            stdout=subprocess.DEVNULL, start_new_session=True)
    client = redis.Redis(port=port, password="redis-password")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "the README's redis-server did not answer"
                time.sleep(0.1)
        yield port, "redis-password"
    finally:
        client.close()
        end_group(proc)
        proc.wait()


def test_the_tools_section_works_word_for_word_in_a_new_folder(tmp_path, readme_redis):
    port, password = readme_redis
    text = section("jobs.md", "Write your own tools and jobs")
    code = blocks(text)
    tools = next(body for lang, body in code if body.startswith("# my_tools.py"))
    job = next(body for lang, body in code if body.startswith("# run_job.py"))
    (shell,) = [body for lang, body in code if lang == "sh"]
    folder = tmp_path / "my-project"
    folder.mkdir()
    (folder / "my_tools.py").write_text(tools)
    (folder / "run_job.py").write_text(job)
    script = "set -e\n" + shell.replace("8080", str(free_port()))
    env = shell_env(tmp_path, DROVER_REDIS_URL=f"redis://:{password}@127.0.0.1:{port}/0")
    log = tmp_path / "out.log"
    code_ = run_script(script, folder, env, log)
    out = log.read_text(errors="replace")
    assert code_ == 0, out[-4000:]
    records = re.findall(r"^#(\d+) (\w+) calls=(\d+) ", out, re.M)
    assert records, out[-4000:]
    assert all(status == "ok" and int(calls) >= 1 for _, status, calls in records), records
    counts = re.search(r"^\{'ok': (\d+), 'failed': 0, 'cancelled': 0, 'budget_exceeded': 0\}$",
                       out, re.M)
    assert counts and int(counts.group(1)) == len(records), out[-4000:]
    assert "cache reads:" in out
    assert "Traceback" not in out and "DuplicateNodenameWarning" not in out


def test_the_several_hosts_section_works_word_for_word(tmp_path, readme_redis):
    port, password = readme_redis
    text = section("deployment.md", "By hand")
    settings = blocks(text.split("**2. The same settings on every host.**")[1])[0][1]
    sim = re.search(r"run `(drover sim [^`]+)`", settings.replace("\\\n#  ", ""))
    sim_env = re.search(r"export\s+(DROVER_ANTHROPIC_BASE_URL=\S+ ANTHROPIC_API_KEY=\S+)",
                        settings.replace("\n#  ", " "))
    assert sim and sim_env, settings
    workers = blocks(text.split("**3. Workers**")[1])[0][1].splitlines()[0]
    assert workers == "drover worker --concurrency 32", workers
    step5 = " ".join(text.split("**5. Submit**")[1].split())
    for command in ("drover submit job.json --wait", "drover watch JOB_ID",
                    "drover stats --plot usage.png"):
        assert f"`{command}`" in step5, (command, step5)
    # The job spec of the page step 5 links to (jobs.md, "From the shell").
    shell = blocks(section("jobs.md", "From the shell"))[0][1]
    spec = shell[:shell.index("JSON\n", shell.index("<<'JSON'") + 8) + 5]
    assert spec.startswith("cat > job.json <<'JSON'\n"), shell
    submit = "\n".join([spec, "drover submit job.json --wait | tee submit.out",
                        "drover watch $(head -n1 submit.out)", "drover stats --plot usage.png"])

    sim_port = free_port()

    def on_this_machine(line: str) -> str:
        return (line.replace("10.0.0.5:6379", f"127.0.0.1:{port}")
                .replace("10.0.0.5:8080", f"127.0.0.1:{sim_port}")
                .replace("--port 8080", f"--port {sim_port}")
                .replace("--host 0.0.0.0", "--host 127.0.0.1"))

    host_a, host_b = tmp_path / "host-a", tmp_path / "host-b"
    host_a.mkdir()
    host_b.mkdir()
    script = "\n".join([
        "set -e -o pipefail",
        on_this_machine(settings),                        # step 2, on every host
        on_this_machine(sim.group(1)) + " &",             # step 2's comment: the simulator
        "export " + on_this_machine(sim_env.group(1)),
        f"(cd {host_a} && {workers} &)",                  # step 3, on two "hosts"
        f"(cd {host_b} && {workers} &)",
        submit,                                           # step 5
    ])
    folder = tmp_path / "submitter"
    folder.mkdir()
    log = tmp_path / "out.log"
    code = run_script(script, folder, shell_env(tmp_path), log)
    out = log.read_text(errors="replace")
    assert code == 0, out[-4000:]
    table = (folder / "submit.out").read_text()
    assert "ok=3 failed=0 cancelled=0 budget_exceeded=0" in table, table
    assert (folder / "usage.png").stat().st_size > 0
    assert "Traceback" not in out and "DuplicateNodenameWarning" not in out
    nodes = set(re.findall(r"(\S+@\S+) ready\.", out))
    assert len(nodes) == 2, nodes  # two workers on one machine: two nodes
