"""drover inside a project of the user's own: nothing of theirs collides with ours.

drover installs one root package, ``drover``; a project whose own ``config/``, ``workers/``,
``orchestrator/`` and ``simulator/`` packages come first on the path (Django's usual layout
has ``config/``) must change nothing. Real ``drover worker`` processes started from inside the
project, a tool module that imports the project's own ``config``, a job script of the
project's, and a second Celery app of the user's (its own broker and ``current_app``) that
submits a drover job from inside one of its tasks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from drover.orchestrator.ops.services import start_redis_server
from tests.helpers import stop_process_group, wait_until

SHADOWED = ("config", "workers", "orchestrator", "simulator")


def _project(root: Path) -> Path:
    """A project with packages named like drover's rooms, a tool module and a job script."""
    for name in SHADOWED:
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(
            f"WHO = 'the project\\'s own {name}'\nDEBUG = True\n")
    (root / "my_tools.py").write_text(textwrap.dedent('''
        from config import DEBUG, WHO  # the project's own config, not drover's
        from drover import tool

        @tool(kind="read")
        def project_fact(topic: str) -> str:
            "A fact about a topic, from the project's own code."
            return f"{topic}: told by {WHO} (debug={DEBUG})"
    '''))
    (root / "run_job.py").write_text(textwrap.dedent('''
        import json, sys
        import config, workers  # the project's own: imported before drover on purpose
        from drover import JobSpec, submit

        assert config.WHO == "the project's own config", config.WHO
        handle = submit(JobSpec(subtasks=[f"topic {i}" for i in range(6)],
                                tools=["project_fact"], max_tokens=64))
        result = handle.wait(timeout=240)
        print(json.dumps({"statuses": [r.status for r in result.results],
                          "workers": workers.WHO}))
    '''))
    return root


def _drover_worker(project: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    """``drover worker`` as a user starts it: from the project's folder."""
    script = Path(sys.executable).with_name("drover")
    command = ([str(script)] if script.exists()
               else [sys.executable, "-m", "drover.orchestrator.cli"])
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*command, "worker", "--concurrency", "4", "--without-gossip", "--without-mingle",
             "-n", f"proj-{uuid.uuid4().hex[:6]}@%h"],
            cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture
def project_env(tmp_path: Path, drover_env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    project = _project(tmp_path / "myproj")
    env = {**os.environ, **drover_env, "DROVER_TOOL_MODULES": json.dumps(["my_tools"]),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(project),
                                                        os.environ.get("PYTHONPATH")]))}
    return project, env


def test_a_project_with_its_own_config_and_workers_packages_runs_drover_jobs(
        project_env, tmp_path):
    project, env = project_env
    logs = [tmp_path / f"worker-{i}.log" for i in range(2)]
    workers = [_drover_worker(project, env, log) for log in logs]
    try:
        for log in logs:
            wait_until(f"{log.name} to say ready",
                       lambda log=log: "ready." in log.read_text(errors="replace")
                       or workers[logs.index(log)].poll() is not None, timeout=120)
        for proc, log in zip(workers, logs, strict=True):
            assert proc.poll() is None, log.read_text(errors="replace")
        done = subprocess.run([sys.executable, "run_job.py"], cwd=project, env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        for proc in workers:
            stop_process_group(proc)
    worker_logs = "".join(log.read_text(errors="replace") for log in logs)
    assert done.returncode == 0, done.stdout + done.stderr + worker_logs
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["statuses"] == ["ok"] * 6, (out, worker_logs)
    assert out["workers"] == "the project's own workers"
    assert "Traceback" not in worker_logs + done.stderr


def test_a_task_of_the_users_own_celery_app_submits_a_drover_job(project_env, tmp_path):
    """The user's app (its own broker, its own ``current_app``) calls ``drover.submit`` from
    one of its tasks, as a Django or FastAPI service would: the job goes to drover's broker
    and workers, not to the app that happens to be current."""
    project, env = project_env
    try:
        own_redis = start_redis_server()  # the user's broker and results: not drover's Redis
    except FileNotFoundError as missing:
        pytest.skip(str(missing))
    (project / "userapp.py").write_text(textwrap.dedent(f'''
        from celery import Celery
        from drover import JobSpec, submit

        app = Celery("userapp", broker="{own_redis.url}", backend="{own_redis.url}")
        app.conf.update(task_serializer="json", result_serializer="json",
                        accept_content=["json"])
        app.set_current()
        app.set_default()

        @app.task(name="userapp.fan_out")
        def fan_out(n):
            handle = submit(JobSpec(subtasks=[f"topic {{i}}" for i in range(n)],
                                    tools=["project_fact"], max_tokens=64))
            result = handle.wait(timeout=240)
            return {{"job": handle.id, "statuses": [r.status for r in result.results]}}
    '''))
    user_log, drover_log = tmp_path / "userapp.log", tmp_path / "drover-worker.log"
    drover_worker = _drover_worker(project, env, drover_log)
    with open(user_log, "wb") as out:
        user_worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "userapp", "worker", "--pool", "threads",
             "--concurrency", "2", "--loglevel", "INFO", "--without-gossip", "--without-mingle",
             "-n",
             f"user-{uuid.uuid4().hex[:6]}@%h"],
            cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for log in (drover_log, user_log):
            wait_until(f"{log.name} to say ready",
                       lambda log=log: "ready." in log.read_text(errors="replace"),
                       timeout=120)
        call = ("import json, userapp; "
                "print(json.dumps(userapp.fan_out.delay(4).get(timeout=280)))")
        done = subprocess.run([sys.executable, "-c", call], cwd=project, env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        stop_process_group(user_worker)
        stop_process_group(drover_worker)
        own_redis.close()
    logs = user_log.read_text(errors="replace") + drover_log.read_text(errors="replace")
    assert done.returncode == 0, done.stdout + done.stderr + logs
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["statuses"] == ["ok"] * 4, (out, logs)
