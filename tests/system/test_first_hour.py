"""A new user's first hour with a project of their own (issue 29): every step answers the way
the README says, and every dead end answers at once.

The CLI runs as the installed ``drover`` console script, from a project folder of the test's
own, with no PYTHONPATH: as a user runs it (``python -m`` would put the folder on sys.path
and hide what a console script does not do).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tests.helpers import stop_process_group, wait_until
from tests.helpers.ports import free_port

BOUND_S = 120  # a generous bound on a command; never what is tested


def drover_script() -> str:
    """The installed ``drover`` command of this interpreter."""
    beside = Path(sys.executable).parent / "drover"
    found = str(beside) if beside.exists() else shutil.which("drover")
    assert found, "no `drover` console script: install drover (pip install -e .)"
    return found


def user_env(drover_env: dict[str, str] | None = None, **values: str) -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH, no settings but the ones given."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DROVER_", "ANTHROPIC_", "COLUMNS", "PYTHONPATH"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(drover_env or {})
    env.update(values)
    return env


TOOLS = '''\
from pathlib import Path

from drover import tool

VISITS = Path(__file__).with_name("visits.txt")


@tool
def record_visit(topic: str) -> str:
    """Note that a sub-agent looked at a topic."""
    with VISITS.open("a") as out:
        out.write(topic + "\\n")
    return f"noted {topic}"
'''


class Worker:
    """``drover worker`` started from a folder, its output in a log file."""

    def __init__(self, cwd: Path, env: dict[str, str], name: str, *args: str):
        self.log = cwd / f"{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [drover_script(), "worker", "--concurrency", "4", *args], cwd=cwd, env=env,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> str:
        """The node name from Celery's ``<name> ready.`` line."""
        def ready() -> str | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"the worker exited {self.proc.returncode}: {self.text()}")
            found = re.search(r"(\S+@\S+) ready\.", self.text())
            return found.group(1) if found else None

        return str(wait_until(f"the worker logging 'ready.' in {self.log}", ready, 90))

    def stop(self) -> None:
        stop_process_group(self.proc)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "my-project"
    folder.mkdir()
    (folder / "my_tools.py").write_text(TOOLS)
    (folder / "job.json").write_text(
        '{"subtasks": ["Look at vendor A", "Look at vendor B", "Look at vendor C"], '
        '"tools": ["record_visit"], "max_tokens": 200}')
    return folder


def test_workers_started_in_the_project_folder_import_its_bare_tool_and_are_distinct_nodes(
        sim, drover_env, project, tmp_path):
    env = user_env(drover_env, DROVER_TOOL_MODULES='["my_tools"]')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    refused = subprocess.run([drover_script(), "worker"], cwd=elsewhere, env=env,
                             capture_output=True, text=True, timeout=BOUND_S)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "the tool module 'my_tools' (DROVER_TOOL_MODULES) is not importable here" in (
        refused.stderr)
    assert "working folder" in refused.stderr and "Traceback" not in refused.stderr

    first = Worker(project, env, "first")
    second = None
    try:
        host = socket.gethostname()
        assert first.wait_ready() == f"celery@{host}"
        second = Worker(project, env, "second")
        assert second.wait_ready() == f"celery2@{host}"
        done = subprocess.run([drover_script(), "submit", "job.json", "--wait"], cwd=project,
                              env=env, capture_output=True, text=True, timeout=BOUND_S)
    finally:
        for worker in (first, second):
            if worker is not None:
                worker.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok=3" in done.stdout
    assert (project / "visits.txt").read_text().strip(), "the bare @tool never ran"
    for text in (first.text(), second.text(), done.stdout + done.stderr):
        assert "DuplicateNodenameWarning" not in text
        assert "Traceback" not in text

    # A worker killed with kill -9 leaves its name free for the next one at once.
    third = Worker(project, env, "third")
    try:
        assert third.wait_ready() == f"celery@{host}"
        os.killpg(third.proc.pid, signal.SIGKILL)
        third.proc.wait()
        fourth = Worker(project, env, "fourth")
        try:
            assert fourth.wait_ready() == f"celery@{host}"
        finally:
            fourth.stop()
    finally:
        third.stop()


def test_a_tool_registers_bare_and_with_arguments():
    from drover import tool
    from drover.workers.tools import REGISTRY

    @tool
    def first_hour_bare(x: int) -> int:
        """Bare."""
        return x

    @tool("first_hour_named", kind="write", timeout_s=3)
    def anything(x: int) -> int:
        """Named."""
        return x

    @tool()
    def first_hour_empty(x: int) -> int:
        """Empty parentheses."""
        return x

    assert first_hour_bare(2) == 2 and anything(3) == 3  # the functions stay themselves
    assert REGISTRY["first_hour_bare"].input_schema["properties"] == {"x": {"type": "integer"}}
    assert REGISTRY["first_hour_named"].kind == "write"
    assert REGISTRY["first_hour_named"].timeout_s == 3
    assert "first_hour_empty" in REGISTRY
    with pytest.raises(TypeError, match="name must be a string"):
        tool(42)  # type: ignore[call-overload]


def test_python_submit_with_nothing_at_the_redis_url_raises_drovers_own_error(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    (tmp_path / "run_job.py").write_text(textwrap.dedent("""\
        from drover import JobSpec, Unreachable, submit

        try:
            submit(JobSpec(subtasks=["one"]))
        except Unreachable as error:
            print("caught:", error)
        submit(JobSpec(subtasks=["one"]))  # uncaught: the user's own traceback, short
        """))
    proc = subprocess.run([sys.executable, "run_job.py"], cwd=tmp_path,
                          env=user_env(DROVER_REDIS_URL=url), capture_output=True, text=True,
                          timeout=60)  # the clients' reconnect loop alone took 76 s
    assert proc.stdout.startswith(f"caught: cannot reach Redis at {url} (DROVER_REDIS_URL)"), (
        proc.stdout + proc.stderr)
    assert "Start Redis there, or set DROVER_REDIS_URL" in proc.stdout
    last = proc.stderr.strip().splitlines()
    assert last[-2].startswith("drover.errors.Unreachable: cannot reach Redis"), last
    assert len(last) < 25, proc.stderr  # not the redis client's 54 lines


def test_a_misspelt_field_in_python_names_the_closest_one():
    from pydantic import ValidationError

    from drover import JobSpec

    with pytest.raises(ValidationError) as raised:
        JobSpec(subtasks=["a secret subtask"], max_token=400)  # type: ignore[call-arg]
    text = str(raised.value)
    assert "max_token\n  not a JobSpec field; did you mean 'max_tokens'?" in text, text
    assert "Extra inputs are not permitted" not in text
    assert "a secret subtask" not in text  # inputs are not repeated in errors
    with pytest.raises(ValidationError) as raised:
        JobSpec.model_validate({"subtasks": ["a"], "max_tokens": 0, "zzz": 1})
    errors = {e["loc"]: e["msg"] for e in raised.value.errors()}
    assert errors[("max_tokens",)].startswith("Input should be greater than or equal to 1")
    assert errors[("zzz",)].startswith("not a JobSpec field (fields: subtasks, goal")


def test_ctrl_c_during_submit_wait_says_the_job_goes_on_and_how_to_follow_it(
        drover_env, tmp_path):
    (tmp_path / "job.json").write_text('{"subtasks": ["nobody runs this yet"]}')
    # Ctrl-C as a terminal delivers it: SIGINT at its default in the child, which Python
    # turns into KeyboardInterrupt. A suite started in the background (`.ci/run &`) has SIGINT
    # ignored, children inherit that, and Python then installs no handler at all.
    proc = subprocess.Popen([drover_script(), "submit", "job.json", "--wait"], cwd=tmp_path,
                            env=user_env(drover_env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    guard = threading.Timer(BOUND_S, lambda: stop_process_group(proc, timeout=5))
    guard.start()
    try:
        job_id = proc.stdout.readline().strip()  # printed at once, before the wait
        assert re.fullmatch(r"[0-9a-f]{32}", job_id), job_id
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=BOUND_S)
    finally:
        guard.cancel()
        stop_process_group(proc)
    assert proc.returncode == 130, out + err
    assert f"job {job_id} keeps running" in err
    assert f"drover watch {job_id}" in err and f"drover cancel {job_id}" in err
    assert "Traceback" not in err


def test_watch_off_a_terminal_prints_progress_lines(drover_env, spawn_worker, tmp_path):
    from drover import JobSpec, submit

    handle = submit(JobSpec(subtasks=["one", "two", "three", "four"], max_tokens=32))
    spawn_worker(concurrency=4)
    proc = subprocess.run([drover_script(), "watch", handle.id], cwd=tmp_path,
                          env=user_env(drover_env), capture_output=True, text=True,
                          timeout=BOUND_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("progress: ")]
    shape = (r"progress: \d/4 finished( \(ok=\d\))?, \d pending( \(\d generating\))?, "
             r"\d+ s")
    assert lines and all(re.fullmatch(shape, line) for line in lines), proc.stdout
    assert "ok=4" in proc.stdout


def test_a_request_that_can_never_fit_the_input_limit_fails_at_once_with_the_sizes(
        sim, drover_env, spawn_worker, monkeypatch):
    from drover import JobSpec, submit
    from tests.helpers import configure

    configure(monkeypatch, drover_env, ITPM=30000)
    sim.configure(itpm=30_000, refuse_oversized=True)  # the provider, with the same limit
    handle = submit(JobSpec(subtasks=["word " * 40_000, "a short one"], max_tokens=32))
    spawn_worker(concurrency=2)
    result = handle.wait(timeout=BOUND_S)
    big, small = result.results
    assert small.status == "ok"
    assert (big.status, big.error_type, big.attempts <= 1) == ("failed", "request_too_large",
                                                               True), big
    assert re.search(r"needs about [\d,]+ input tokens \(estimated\), more than a whole minute "
                     r"of \S+'s input-token limit, 30,000 \(DROVER_ITPM\)", big.error), big.error
    assert big.usage.calls == 0  # never sent
    assert sim.stats()["accepted"] == 1  # only the short one's call
    assert sim.stats()["rejected_429"] == 0
    # The provider refuses that request every time, with full buckets.
    assert "30,000 input tokens per minute" in _provider_refuses(
        sim, max_tokens=32, messages=[{"role": "user", "content": "word " * 40_000}])


UNCONFIGURED = "claude-haiku-4-5"  # no limit of it is configured: only headers can tell


def _provider_refuses(sim, **request: object) -> str:  # noqa: ANN001
    """What the simulator answers a direct request on a key of its own (full buckets):
    the provider's refusal of a request larger than a whole minute of a limit."""
    import anthropic

    client = anthropic.Anthropic(base_url=sim.url, api_key="sk-direct", max_retries=0)
    try:
        with pytest.raises(anthropic.RateLimitError) as refused:
            client.messages.create(model=UNCONFIGURED, **request)  # type: ignore[call-overload]
    finally:
        client.close()
    return str(refused.value)


def test_a_request_over_a_learned_limit_fails_at_once_where_the_provider_would_refuse_it(
        sim, drover_env, spawn_worker):
    from drover import JobSpec, submit

    # A provider that reserves max_tokens at admission and refuses what a minute cannot hold.
    sim.configure(itpm=30_000, otpm=2_000, otpm_mode="max_tokens", refuse_oversized=True)
    spawn_worker(concurrency=2)
    first = submit(JobSpec(subtasks=["a short one"], model=UNCONFIGURED, max_tokens=32))
    assert first.wait(timeout=BOUND_S).counts["ok"] == 1  # its answer's headers taught both
    accepted = sim.stats()["accepted"]

    big = "word " * 40_000
    result = submit(JobSpec(subtasks=[big, "a short one"], model=UNCONFIGURED, max_tokens=32)
                    ).wait(timeout=BOUND_S)
    too_big, small = result.results
    assert small.status == "ok"
    assert (too_big.status, too_big.error_type, too_big.attempts <= 1, too_big.usage.calls) == (
        "failed", "request_too_large", True, 0), too_big
    assert re.search(r"needs about [\d,]+ input tokens \(estimated\), more than a whole minute "
                     rf"of {UNCONFIGURED}'s input-token limit, 30,000 \(learned from the "
                     r"provider's anthropic-ratelimit-input-tokens-limit header\)",
                     too_big.error), too_big.error

    # max_tokens is a cap, not a reservation, where the provider counts generated tokens
    # (shared/anthropic-api.md): one above a minute of the output-token limit goes out.
    sim.configure(otpm_mode="generated")
    long = submit(JobSpec(subtasks=["one"], model=UNCONFIGURED, max_tokens=4_000)
                  ).wait(timeout=BOUND_S)
    assert long.counts["ok"] == 1, [r.error for r in long.results]
    assert sim.stats()["accepted"] == accepted + 2  # the short one and this one
    assert sim.stats()["rejected_429"] == 0  # and nothing was sent to be refused

    # What drover refused, the provider refuses every time, with full buckets.
    assert "30,000 input tokens per minute" in _provider_refuses(
        sim, max_tokens=32, messages=[{"role": "user", "content": big}])


def test_a_spec_whose_system_prompt_no_minute_can_hold_is_refused_before_anything_is_enqueued(
        sim, drover_env, monkeypatch, tmp_path, redis_url):
    import redis

    from drover import JobSpec, submit
    from tests.helpers import configure

    configure(monkeypatch, drover_env, ITPM=2000)
    system = "Inspect every crate. " * 600  # about 4,000 tokens, every call's prefix
    said = ("the system prompt and tool definitions alone are about ")
    with pytest.raises(ValueError) as refused:
        submit(JobSpec(subtasks=["a", "b"], system=system, max_tokens=64))
    assert said in str(refused.value) and "every sub-agent's call would be refused" in str(
        refused.value)
    assert "2,000 (DROVER_ITPM)" in str(refused.value)
    (tmp_path / "job.json").write_text(json.dumps(
        {"subtasks": ["a", "b"], "system": system, "max_tokens": 64}))
    done = subprocess.run([drover_script(), "submit", "job.json", "--wait"], cwd=tmp_path,
                          env=user_env(drover_env), capture_output=True, text=True,
                          timeout=BOUND_S)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"refused, nothing was enqueued: {said}" in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr and not done.stdout.strip()
    client = redis.Redis.from_url(redis_url)
    try:  # no job of this test's queue, no task on its broker queue
        prefix, queue = drover_env["DROVER_KEY_PREFIX"], drover_env["DROVER_QUEUE"]
        assert queue.encode() not in [client.hget(f"{prefix}:job:{j.decode()}:meta", "queue")
                                      for j in client.zrange(f"{prefix}:jobs", 0, -1)]
        assert client.llen(f"{prefix}:celery:{queue}") == 0
    finally:
        client.close()
    # A max_tokens above a minute of the output-token limit is no reason to refuse: the
    # provider counts the tokens an answer generates.
    configure(monkeypatch, drover_env, ITPM=30_000, OTPM=2000)
    submit(JobSpec(subtasks=["a"], max_tokens=4_000)).cancel()


def test_a_horizon_retry_reads_as_one_consistent_sentence(sim, drover_env, project):
    # Four sub-agents at once at one request a second: the fourth's capacity is 3 s away, past
    # a 1 s horizon. (Waiting in line, the window would hold them back instead: off here.)
    env = user_env(drover_env, DROVER_RPM="60", DROVER_HORIZON_S="1", DROVER_BURST_SECONDS="1",
                   DROVER_WAIT_IN_LINE="false")
    (project / "many.json").write_text(
        '{"subtasks": ["a", "b", "c", "d", "e", "f"], "max_tokens": 16}')
    worker = Worker(project, env, "horizon", "-n", f"horizon-{os.getpid()}@%h")
    try:
        worker.wait_ready()
        done = subprocess.run([drover_script(), "submit", "many.json", "--wait"], cwd=project,
                              env=env, capture_output=True, text=True, timeout=BOUND_S)
    finally:
        worker.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    reasons = re.findall(r"limiter horizon: the capacity for this call is ([\d.]+) s away "
                         r"\(other calls are queued before it\), longer than a worker waits in "
                         r"its slot \(DROVER_HORIZON_S=1 s\), so the slot is freed meanwhile",
                         worker.text())
    assert reasons, worker.text()[-3000:]
    assert all(float(away) > 1 for away in reasons), reasons  # the sentence holds together


def test_a_clean_sigterm_logs_no_error(sim, drover_env, project):
    env = user_env(drover_env, DROVER_TOOL_MODULES='["my_tools"]')
    worker = Worker(project, env, "sigterm", "-n", f"sigterm-{os.getpid()}@%h")
    try:
        worker.wait_ready()
        done = subprocess.run([drover_script(), "submit", "job.json", "--wait"], cwd=project,
                              env=env, capture_output=True, text=True, timeout=BOUND_S)
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        worker.proc.send_signal(signal.SIGTERM)  # the main process only, as systemd does
        try:
            worker.proc.wait(timeout=60)
        finally:
            worker.stop()
    text = worker.text()
    assert worker.proc.returncode == 0, text[-3000:]
    assert "Task was destroyed but it is pending" not in text, text[-3000:]
    assert not [line for line in text.splitlines() if "ERROR" in line], text[-3000:]


def test_the_result_and_stats_say_why_nothing_was_cached(sim, drover_env, spawn_worker,
                                                         tmp_path):
    short = tmp_path / "short.json"
    short.write_text('{"subtasks": ["a", "b", "c"], "system": "You are brief.", '
                     '"max_tokens": 16}')
    long = tmp_path / "long.json"
    long.write_text('{"subtasks": ["a", "b", "c"], "system": "%s", "max_tokens": 16}'
                    % ("You are a careful analyst who reads every line. " * 150))
    spawn_worker(concurrency=1)  # one at a time: the first writes the cache, the others read
    env = user_env(drover_env)
    scope = f"llm:{drover_env['DROVER_KEY_ALIAS']}:claude-sonnet-4-6"
    short_calls = 0
    for spec, says in ((short, r"cache: nothing cached: the shared prefix \(system prompt and "
                               r"tool definitions, about \d+ tokens\) is below "
                               r"claude-sonnet-4-6's minimum cacheable length of 1,024 tokens"),
                       (long, r"[1-9][\d,]* cache write, [1-9][\d,]* cache read tokens")):
        done = subprocess.run([drover_script(), "submit", str(spec), "--wait"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=BOUND_S)
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.search(says, done.stdout), done.stdout
        job_id = done.stdout.split()[0]
        again = subprocess.run([drover_script(), "result", job_id], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=BOUND_S)
        assert re.search(says, again.stdout), again.stdout

        # drover stats says it too, for every call of the scope in its window.
        provider = sim.stats()
        short_calls = short_calls or provider["accepted"]  # the first job's calls
        stats = subprocess.run([drover_script(), "stats"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=BOUND_S)
        assert stats.returncode == 0, stats.stdout + stats.stderr
        text = " ".join(stats.stdout.split())
        why = (f"of the {short_calls} answers that used no cache, {short_calls} had a shared "
               "prefix (system prompt and tool definitions) below claude-sonnet-4-6's minimum "
               "cacheable length of 1,024 tokens, or none, so each sent it whole")
        read, written = (provider["cache_read_input_tokens"],
                         provider["cache_creation_input_tokens"])
        head = "nothing cached" if spec is short else (
            f"{read:,} tokens read from the cache, {written:,} written to it")
        assert spec is short or (read and written), provider
        assert f"cache {scope}, last 60 min: {head}; {why}" in text, text


def test_every_text_about_the_simulator_says_to_set_a_key_and_the_simulator_says_so_too(
        sim, tmp_path):
    import json
    import urllib.error
    import urllib.request

    from tests.helpers import ROOT

    help_text = subprocess.run([drover_script(), "worker", "--help"], cwd=tmp_path,
                               env=user_env(), capture_output=True, text=True, timeout=BOUND_S)
    assert help_text.returncode == 0, help_text.stderr
    flat = " ".join(help_text.stdout.split())
    assert "simulator (drover sim) needs a key, as the API does, and takes any: " \
           "ANTHROPIC_API_KEY=sk-sim" in flat, flat[:2000]
    for page in ("docs/deployment.md", "docs/jobs.md"):
        text = (ROOT / page).read_text()
        for line in text.splitlines():
            if "DROVER_ANTHROPIC_BASE_URL=http" in line:
                assert "ANTHROPIC_API_KEY=sk-sim" in line, (page, line)
    # A keyless request: the simulator's 401 says what to set.
    request = urllib.request.Request(
        f"{sim.url}/v1/messages", method="POST", data=json.dumps({
            "model": "claude-sonnet-4-6", "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"anthropic-version": "2023-06-01", "content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    body = refused.value.read().decode()
    assert refused.value.code == 401
    assert "set ANTHROPIC_API_KEY, e.g. ANTHROPIC_API_KEY=sk-sim" in body, body
