"""First contact: each mistake a new user makes gets a fast, clear answer from the CLI.

Every command runs as a subprocess, as a user runs it, from an empty directory (no ``.env``)
with no DROVER_* or ANTHROPIC_* variables but the ones a test sets. Each answer must name
the variable or the fix, exit with the documented code, print no traceback, and come before
a generous bound (the ``timeout`` of ``subprocess.run``): the bound is not what is tested,
the one short connect attempt (``FIRST_CONTACT_TIMEOUT_S``) is.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from drover.workers.connections.preflight import FIRST_CONTACT_TIMEOUT_S
from tests.helpers import ROOT
from tests.helpers.cli import BOUND_S, clean_env, drover
from tests.helpers.ports import free_port


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.json"
    path.write_text('{"subtasks": ["Summarise vendor A"], "max_tokens": 64}')
    return path


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (a firewall, a wrong service)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


# --- row 1: nothing listening at DROVER_REDIS_URL ---------------------------------------------

def test_the_first_contact_is_one_short_attempt():
    assert FIRST_CONTACT_TIMEOUT_S <= 5


@pytest.mark.parametrize("command", [["submit", "SPEC", "--wait"], ["stats"],
                                     ["cancel", "0123abcd"]])
def test_commands_say_at_once_that_nothing_listens_at_the_redis_url(command, spec_file,
                                                                     tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    args = [str(spec_file) if a == "SPEC" else a for a in command]
    proc = drover(args, clean_env(DROVER_REDIS_URL=url, ANTHROPIC_API_KEY="sk-x"), tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert f"cannot reach Redis at {url} (DROVER_REDIS_URL)" in proc.stderr
    assert "Connection refused" in proc.stderr
    assert f"connect timeout {FIRST_CONTACT_TIMEOUT_S:g} s" in proc.stderr
    assert "Start Redis there, or set DROVER_REDIS_URL" in proc.stderr


def test_a_redis_url_that_never_answers_fails_after_one_connect_timeout(silent_port, spec_file,
                                                                        tmp_path):
    url = f"redis://:hunter2-secret@127.0.0.1:{silent_port}/0"
    proc = drover(["submit", str(spec_file)], clean_env(DROVER_REDIS_URL=url), tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert f"no answer within {FIRST_CONTACT_TIMEOUT_S:g} s" in proc.stderr
    assert "DROVER_REDIS_URL" in proc.stderr and "hunter2-secret" not in proc.stderr


def test_a_separate_broker_that_does_not_answer_is_named(redis_url, spec_file, tmp_path):
    broker = f"redis://127.0.0.1:{free_port()}/1"
    proc = drover(["submit", str(spec_file)],
                  clean_env(DROVER_REDIS_URL=redis_url, DROVER_BROKER_URL=broker), tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert f"cannot reach the broker at {broker} (DROVER_BROKER_URL)" in proc.stderr


def test_the_worker_refuses_to_start_when_redis_does_not_answer(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    env = clean_env(DROVER_REDIS_URL=url, ANTHROPIC_API_KEY="sk-x")
    proc = drover(["worker"], env, tmp_path)
    assert proc.returncode == 3 and "DROVER_REDIS_URL" in proc.stderr, proc.stderr
    celery = subprocess.run([sys.executable, "-m", "celery", "-A", "drover.workers.app", "worker"],
                            cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=BOUND_S)
    assert celery.returncode == 3 and "DROVER_REDIS_URL" in celery.stderr, celery.stderr
    assert "Traceback" not in celery.stdout + celery.stderr


# --- row 2: a worker without an API key -----------------------------------------------------

def test_the_worker_refuses_to_start_without_an_api_key(redis_url, tmp_path):
    env = clean_env(DROVER_REDIS_URL=redis_url)
    for command in ([sys.executable, "-m", "drover.orchestrator.cli", "worker"],
                    [sys.executable, "-m", "celery", "-A", "drover.workers.app", "worker"]):
        proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=BOUND_S)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "no API key: set ANTHROPIC_API_KEY" in proc.stderr
        assert "DROVER_ANTHROPIC_BASE_URL" in proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr


def test_a_worker_on_openai_asks_for_openai_s_key_and_starts_without_anthropic_s(
        redis_url, tmp_path, monkeypatch):
    """DROVER_PROVIDER=openai: the worker asked for ANTHROPIC_API_KEY, so a team on OpenAI
    alone could not start one. It asks for OPENAI_API_KEY, and starts with that key only."""
    env = clean_env(DROVER_REDIS_URL=redis_url, DROVER_PROVIDER="openai")
    env.pop("OPENAI_API_KEY", None)
    proc = drover(["worker"], env, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no API key: set OPENAI_API_KEY" in proc.stderr and "ANTHROPIC" not in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    from drover.config import Settings
    from drover.workers.connections.preflight import check_worker

    for name in ("ANTHROPIC_API_KEY", "DROVER_ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN",
                 "DROVER_ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    check_worker(Settings(provider="openai"), services=False)


def test_the_worker_refuses_a_tool_module_that_does_not_import(redis_url, tmp_path):
    (tmp_path / "broken_tools.py").write_text("import nonexistent_dependency_xyz\n")
    env = clean_env(DROVER_REDIS_URL=redis_url, ANTHROPIC_API_KEY="sk-x",
                    PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}",
                    DROVER_TOOL_MODULES="drover.workers.tools.demo,broken_tools")
    proc = drover(["worker"], env, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "the tool module 'broken_tools' (DROVER_TOOL_MODULES) does not import" in proc.stderr
    assert "nonexistent_dependency_xyz" in proc.stderr
    proc = drover(["worker"], {**env, "DROVER_TOOL_MODULES": "no_such_tools"}, tmp_path)
    assert proc.returncode == 2 and "PYTHONPATH" in proc.stderr, proc.stderr


# --- row 3: a URL that is not one -----------------------------------------------------------

@pytest.mark.parametrize(("url", "says"), [
    ("redis://host:notaport/0", "the port 'notaport' is not a number"),
    ("redis://127.0.0.1:6379/zero", "the database 'zero'"),
    ("redis:///0", "no host"),
    ("http://127.0.0.1:6379/0", "scheme 'http'"),
    ("redis://host:70000/0", "the port '70000'"),
    ("unix:///tmp/redis.sock?db=one", "db='one'"),
])
def test_a_malformed_redis_url_is_refused_at_settings_time(url, says):
    from drover.config import SettingsError, load_settings

    with pytest.raises(SettingsError) as refused:
        load_settings(redis_url=url)
    assert "DROVER_REDIS_URL" in str(refused.value) and says in str(refused.value)


def test_every_command_refuses_a_malformed_url_before_connecting(spec_file, tmp_path):
    env = clean_env(DROVER_REDIS_URL="redis://host:notaport/0", ANTHROPIC_API_KEY="sk-x")
    for args in (["submit", str(spec_file)], ["worker"], ["stats"], ["demo", "--on-services"],
                 ["flower"]):
        proc = drover(args, env, tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "DROVER_REDIS_URL: the port 'notaport' is not a number" in proc.stderr, args


def test_a_malformed_broker_url_names_its_own_variable(tmp_path, spec_file):
    env = clean_env(DROVER_BROKER_URL="redis://:pw-not-shown@broker:port/0")
    proc = drover(["submit", str(spec_file)], env, tmp_path)
    assert proc.returncode == 2 and "DROVER_BROKER_URL" in proc.stderr, proc.stderr
    assert "pw-not-shown" not in proc.stderr


# --- row 4: the same exit code for the same situation ---------------------------------------

def test_a_settings_error_exits_2_from_every_command(spec_file, tmp_path):
    env = clean_env(DROVER_RPM="-5", ANTHROPIC_API_KEY="sk-x")
    for args in (["submit", str(spec_file)], ["worker"], ["result", "abc"],
                 ["demo", "--on-services"], ["flower"]):
        proc = drover(args, env, tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "DROVER_RPM" in proc.stderr, (args, proc.stderr)


def test_celerys_own_command_line_reports_a_settings_error_without_a_traceback(tmp_path):
    env = clean_env(DROVER_REDIS_URL="redis://host:notaport/0")
    proc = subprocess.run([sys.executable, "-m", "celery", "-A", "drover.workers.app", "worker"],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=BOUND_S)
    assert proc.returncode == 2, proc.stderr
    assert "DROVER_REDIS_URL: the port 'notaport'" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_usage_errors_and_bad_specs_exit_2(tmp_path, redis_url):
    env = clean_env(DROVER_REDIS_URL=redis_url)
    assert drover(["submit"], env, tmp_path).returncode == 2
    assert drover(["no-such-command"], env, tmp_path).returncode == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"subtask": ["a"], "max_token": 5, "sytem": "x"}')
    proc = drover(["submit", str(bad)], env, tmp_path)
    assert proc.returncode == 2
    assert "subtask: not a JobSpec field; did you mean 'subtasks'?" in proc.stderr
    assert "max_token: not a JobSpec field; did you mean 'max_tokens'?" in proc.stderr
    assert "sytem: not a JobSpec field; did you mean 'system'?" in proc.stderr
    proc = drover(["submit", str(tmp_path / "missing.json")], env, tmp_path)
    assert proc.returncode == 2 and "cannot read the job spec" in proc.stderr
    proc = drover(["submit", "-"], env, tmp_path, stdin="{not json")
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr
    proc = drover(["watch", "0123456789abcdef"], env, tmp_path)
    assert proc.returncode == 2 and "DROVER_KEY_PREFIX" in proc.stderr, proc.stderr


def test_a_job_naming_an_unknown_tool_or_module_is_refused_with_exit_2(tmp_path, redis_url):
    spec = tmp_path / "job.json"
    spec.write_text('{"subtasks": ["a"], "tools": ["lookup_fcat"]}')
    env = clean_env(DROVER_REDIS_URL=redis_url)
    proc = drover(["submit", str(spec)], env, tmp_path)
    assert proc.returncode == 2 and "lookup_fcat" in proc.stderr, proc.stderr
    proc = drover(["submit", str(spec)], {**env, "DROVER_TOOL_MODULES": "no_such_tools"},
                  tmp_path)
    assert proc.returncode == 2 and "DROVER_TOOL_MODULES" in proc.stderr, proc.stderr


# --- row 6: every command explains itself ---------------------------------------------------

def test_every_subcommand_has_help_with_defaults(tmp_path):
    env = clean_env()
    top = drover(["--help"], env, tmp_path)
    assert top.returncode == 0 and "Exit status" in top.stdout
    for command in ("demo", "submit", "watch", "result", "cancel", "stats", "jobs", "metrics"):
        proc = drover([command, "--help"], env, tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"usage: drover {command}")
        assert "Exit status" in proc.stdout, command
    demo = drover(["demo", "--help"], env, tmp_path).stdout
    assert "(default: 40)" in demo and "--keep" in demo and "(default: 300)" in demo
    submit = drover(["submit", "--help"], env, tmp_path).stdout
    assert '"subtasks"' in submit and '"goal"' in submit
    assert "drover submit job.json --wait" in submit


def test_sim_worker_and_flower_help_are_drovers_own_first(tmp_path):
    env = clean_env()
    sim = drover(["sim", "--help"], env, tmp_path)
    assert sim.returncode == 0 and sim.stdout.startswith("usage: drover sim")
    assert "(default: 8080)" in sim.stdout

    worker = drover(["worker", "--help"], env, tmp_path, timeout=60)
    assert worker.returncode == 0, worker.stderr
    ours, _, celery = worker.stdout.partition("celery worker --help")
    assert ours.startswith("usage: drover worker")
    for option, default in (("--pool", "threads"), ("--concurrency", "32"),
                            ("--queues", "drover"), ("--loglevel", "INFO")):
        assert option in ours and f"(default: {default})" in ours, option
    assert "--autoscale" in celery  # Celery's own options follow

    flower = drover(["flower", "--help"], env, tmp_path, timeout=60)
    assert flower.returncode == 0, flower.stderr
    assert flower.stdout.startswith("usage: drover flower")
    assert "127.0.0.1" in flower.stdout and "12 characters" in flower.stdout
    assert "FLOWER_UNAUTHENTICATED_API" in flower.stdout


# --- row 8 of the list: short Flower passwords beyond loopback ----------------------

def test_flower_beyond_loopback_refuses_a_short_password(tmp_path):
    env = clean_env(DROVER_FLOWER_BASIC_AUTH="ops:short-pw")
    proc = drover(["flower", "--address=0.0.0.0"], env, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "shorter than 12 characters" in proc.stderr and "short-pw" not in proc.stderr


def test_a_taken_port_is_one_message(tmp_path, redis_url):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        env = clean_env(DROVER_REDIS_URL=redis_url)
        for args in (["metrics", "--port", port], ["sim", "--port", port],
                     ["flower", f"--port={port}"]):
            proc = drover(args, env, tmp_path)
            assert proc.returncode == 2 and "cannot listen" in proc.stderr, (args, proc.stderr)


def test_flower_says_when_the_broker_does_not_answer(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    proc = drover(["flower"], clean_env(DROVER_REDIS_URL=url), tmp_path)
    assert proc.returncode == 3 and "DROVER_REDIS_URL" in proc.stderr, proc.stderr


# --- missing extras ------------------------------------------------------------------------

def test_a_missing_plot_library_names_the_demo_extra(tmp_path, redis_url):
    # A directory that shadows matplotlib with a module that fails to import, as if it
    # were not installed.
    shadow = tmp_path / "shadow"
    (shadow / "matplotlib").mkdir(parents=True)
    (shadow / "matplotlib" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'matplotlib'\", name='matplotlib')\n")
    env = clean_env(DROVER_REDIS_URL=redis_url, PYTHONPATH=f"{shadow}{os.pathsep}{ROOT}")
    proc = drover(["stats", "--plot", str(tmp_path / "u.png")], env, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert ".[demo]" in proc.stderr and "matplotlib" in proc.stderr
    proc = drover(["demo"], env, tmp_path)
    assert proc.returncode == 2 and "--no-plot" in proc.stderr, proc.stderr


def test_result_names_the_jobs_model_not_the_readers_drover_model(redis_url, key_prefix,
                                                                  monkeypatch, tmp_path):
    """The job's model is fixed when it is submitted (DROVER_MODEL there); a shell that reads
    it later, with another DROVER_MODEL or none, names the job's."""
    from drover.config import get_settings
    from drover.workers.jobs.records import JobResult, Usage
    from drover.workers.services import services

    env = clean_env(DROVER_REDIS_URL=redis_url, DROVER_KEY_PREFIX=key_prefix,
                    DROVER_QUEUE=f"q-{key_prefix}")
    spec = tmp_path / "job.json"
    spec.write_text('{"subtasks": ["a"], "system": "You are brief.", "max_tokens": 16}')
    sent = drover(["submit", str(spec)], {**env, "DROVER_PROVIDER": "openai",
                                          "DROVER_MODEL": "gpt-4o", "DROVER_TPM": "100000"},
                  tmp_path)
    assert sent.returncode == 0, sent.stderr
    job_id = sent.stdout.split()[-1]
    for name in ("DROVER_REDIS_URL", "DROVER_KEY_PREFIX"):
        monkeypatch.setenv(name, env[name])
    get_settings.cache_clear()
    try:
        store = services().store
        assert store.specs.get(job_id).model == "gpt-4o"
        store.outcomes.save(JobResult(job_id=job_id, status="done", results=[], counts={},
                                      usage=Usage(), wall_s=1.0))
    finally:
        get_settings.cache_clear()
    proc = drover(["result", job_id], env, tmp_path)  # a shell with no DROVER_MODEL
    assert "below gpt-4o's minimum cacheable length" in proc.stdout, proc.stdout + proc.stderr
    assert "claude" not in proc.stdout


def test_submit_says_at_once_when_no_worker_serves_the_queue(redis_url, key_prefix,
                                                             monkeypatch, tmp_path):
    from drover.config import get_settings
    from drover.workers.services import services

    queue = f"q-{key_prefix}"
    env = clean_env(DROVER_REDIS_URL=redis_url, DROVER_KEY_PREFIX=key_prefix,
                    DROVER_QUEUE=queue)
    sent = drover(["submit", "-"], env, tmp_path, stdin='{"subtasks": ["a"]}')
    assert sent.returncode == 0, sent.stderr
    job_id = sent.stdout.split()[-1]
    assert (f"job {job_id} is queued, but no worker serves it yet: no worker alive under "
            f"DROVER_KEY_PREFIX={key_prefix}: start one with `drover worker` "
            f"(DROVER_QUEUE={queue}); it runs once one does") in sent.stderr, sent.stderr

    for name in ("DROVER_REDIS_URL", "DROVER_KEY_PREFIX", "DROVER_QUEUE"):
        monkeypatch.setenv(name, env[name])
    get_settings.cache_clear()
    try:  # a worker serving the queue reports its slots there, as each does every 2 s
        services().fairshare(queue).report_slots("node-a", 4, ttl_s=60)
    finally:
        get_settings.cache_clear()
    served = drover(["submit", "-"], env, tmp_path, stdin='{"subtasks": ["a"]}')
    assert served.returncode == 0 and "no worker" not in served.stderr, served.stderr
