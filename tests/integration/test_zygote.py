"""The test processes' zygote (tests/helpers/zygote.py) starts a command as the interpreter
would: the child's own environment, working folder, arguments, stdout, exit status, signals
(SIGPIPE ignored as Python sets it: a worker writing to a socket a broker closed must get an
error, not die), and its own process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.helpers import ROOT, zygote


@pytest.fixture(autouse=True)
def _installed():
    if subprocess.Popen is not zygote.ZygotePopen:
        pytest.skip("the zygote is off (TEST_ZYGOTE=0)")


def test_a_cli_command_runs_in_its_environment_and_folder_and_says_its_status(tmp_path):
    (tmp_path / ".env").write_text("DROVER_RPM=many\n")  # read from the working folder
    proc = subprocess.run([sys.executable, "-m", "drover.orchestrator.cli", "stats"],
                          cwd=tmp_path, env={**os.environ, "DROVER_ITPM": "lots"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "DROVER_RPM" in proc.stderr and "DROVER_ITPM" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_worker_forked_from_the_zygote_is_a_process_group_of_its_own(drover_env, tmp_path):
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "drover.workers.app", "worker", "--pool",
         "threads", "--concurrency", "1", "--queues", drover_env["DROVER_QUEUE"]],
        cwd=ROOT, env={**os.environ, **drover_env}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    assert isinstance(proc, zygote.ZygotePopen) and proc._zygote is not None
    assert os.getpgid(proc.pid) == proc.pid
    status = open(f"/proc/{proc.pid}/status").read()
    ignored = int(next(line for line in status.splitlines()
                       if line.startswith("SigIgn:")).split()[1], 16)
    assert ignored & (1 << (signal.SIGPIPE - 1)), "SIGPIPE must stay ignored"
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL


def test_a_script_runs_as_python_runs_it(tmp_path):
    """``python script.py``: the script's folder first on sys.path (its sibling module
    imports), its arguments, ``__name__ == "__main__"``, its exit status; ``-c`` is never
    forked (the tests that use it ask what a fresh interpreter imports)."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "helper_mod.py").write_text("VALUE = 'sibling'\n")
    (tmp_path / "sub" / "job.py").write_text(
        "import os, sys, helper_mod\n"
        "if __name__ == '__main__':\n"
        "    print(helper_mod.VALUE, sys.argv[1:], os.getcwd(), os.environ['MARK'])\n"
        "    sys.exit(3)\n")
    proc = subprocess.Popen([sys.executable, "sub/job.py", "a", "b"], cwd=tmp_path,
                            env={**os.environ, "MARK": "m1"}, stdout=subprocess.PIPE, text=True)
    assert proc._zygote is not None
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert out.split() == ["sibling", "['a',", "'b']", str(tmp_path), "m1"]
    probe = subprocess.Popen([sys.executable, "-c", "print(1)"], stdout=subprocess.DEVNULL)
    assert probe._zygote is None
    probe.wait(60)


def test_an_uncaught_error_prints_the_traceback_a_fresh_interpreter_prints(tmp_path):
    (tmp_path / "fails.py").write_text("def f():\n    raise ValueError('no')\n\nf()\n")
    proc = subprocess.run([sys.executable, "fails.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):", proc.stderr
    assert "fails.py" in lines[1] and "runpy" not in proc.stderr, proc.stderr
    assert lines[-1] == "ValueError: no"
