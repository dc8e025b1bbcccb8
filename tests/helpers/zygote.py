"""Worker and CLI processes forked from a zygote that has imported the heavy libraries once.

Why: the suite is bound by the CPU, not by waiting (docs/development.md), and most of that
CPU is spent in the processes the tests start; each ``python -m celery -A drover.workers.app
worker`` or ``python -m drover.orchestrator.cli ...`` paid about 2.7 s of CPU to start, 1.7 s
of it importing the anthropic SDK. Forked from a process that has imported it (and Celery,
kombu, redis-py, httpx), a child starts with those modules in memory, then runs its module
as ``python -m`` would: drover's own modules, its settings (from the child's environment),
the Celery app and its worker are all made in the child, as in production. A child is still
a process of its own with its own pid and process group, killed, signalled and waited on
as before (``kill -9`` included).

How: ``install()`` (tests/conftest.py, in each test process) replaces ``subprocess.Popen``
with ``ZygotePopen``, which hands such a command to this process's zygote
(``_zygote_server.py``, started on first use) with the child's stdin, stdout and stderr (as
file descriptors over a Unix socket); every other command, and any that asks for what a
fork cannot give (``pass_fds``, ``preexec_fn``, a shell, another interpreter, a PYTHON*
variable the zygote did not start with), runs as before. The exit status comes from the
zygote, which reaps its children. ``TEST_ZYGOTE=0`` turns it off."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["ZygotePopen", "install", "uninstall"]

MODULES = ("celery", "drover.orchestrator.cli")
PACKAGES = ("bench",)  # ``python -m bench.<name>``: the benchmarks the smoke tests run
_SERVER = Path(__file__).with_name("_zygote_server.py")
# Variables the interpreter reads at its start: a child must not need other values than the
# zygote's (PYTHONPATH and PYTHONUNBUFFERED the zygote applies itself).
_STARTUP_VARS = ("PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONDEVMODE", "PYTHONOPTIMIZE",
                 "PYTHONFAULTHANDLER", "PYTHONTRACEMALLOC", "PYTHONSAFEPATH", "PYTHONNOUSERSITE",
                 "PYTHONHOME", "PYTHONSTARTUP", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING",
                 "PYTHONUTF8", "PYTHONINSPECT", "PYTHONVERBOSE", "PYTHONMALLOC",
                 "PYTHONPROFILEIMPORTTIME", "PYTHONDEBUG")
_REAL_POPEN = subprocess.Popen


class _Zygote:
    """This process's zygote: one request at a time over a SOCK_SEQPACKET pair."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = dict(os.environ)
        self.proc = _REAL_POPEN([sys.executable, str(_SERVER), str(theirs.fileno())],
                                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, cwd=str(_SERVER.parent))
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()
        self.pid = os.getpid()

    def ask(self, request: dict, fds: list[int] | None = None) -> dict:
        with self.lock:
            data = json.dumps(request).encode()
            if fds:
                socket.send_fds(self.sock, [data], fds)
            else:
                self.sock.send(data)
            return json.loads(self.sock.recv(1 << 16))

    def serves(self, env: dict[str, str]) -> bool:
        return self.proc.poll() is None and all(
            env.get(name) == self.env.get(name) for name in _STARTUP_VARS)

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()


def _the_zygote() -> _Zygote:
    global _zygote
    with _zygote_lock:
        if _zygote is None or _zygote.pid != os.getpid() or _zygote.proc.poll() is not None:
            _zygote = _Zygote()
        return _zygote


def _as_module(args: object, env: dict[str, str]) -> list[str] | None:
    """``[python, "-m", module, *rest]`` or ``[python, "script.py", *rest]`` for a command
    the zygote can start (None: not). Never ``-c``: the tests that run code that way ask
    which modules a fresh interpreter imports."""
    if not isinstance(args, list | tuple) or not args or not all(isinstance(a, str)
                                                                  for a in args):
        return None
    if len(args) >= 3 and args[0] == sys.executable and args[1] == "-m" and (
            args[2] in MODULES or args[2].split(".")[0] in PACKAGES):
        return list(args)
    if len(args) >= 2 and args[0] == sys.executable and args[1].endswith(".py"):
        return list(args)  # a user's script (the docs' blocks, run_job.py)
    # The ``drover`` console script of this interpreter's environment (bin/drover).
    script = shutil.which(args[0], path=env.get("PATH")) if os.path.basename(args[0]) == \
        "drover" else None
    if script and Path(script).parent == Path(sys.executable).parent:
        return [sys.executable, "-m", "drover.orchestrator.cli", *args[1:]]
    return None


class ZygotePopen(_REAL_POPEN):  # type: ignore[misc, valid-type]
    """``subprocess.Popen``, forking drover's worker and CLI commands from the zygote."""

    _zygote: _Zygote | None = None

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,  # noqa: ANN001, PLR0913
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite,
                       errread, errwrite, restore_signals, gid, gids, uid, umask,
                       start_new_session, process_group) -> None:
        child_env = {k: str(v) for k, v in (os.environ if env is None else env).items()}
        command = None if shell or executable is not None else _as_module(args, child_env)
        if (os.environ.get("TEST_ZYGOTE", "1") != "0" and command is not None
                and preexec_fn is None and not pass_fds and process_group in (None, -1)
                and gid is None and not gids and uid is None and umask < 0):
            zygote = _the_zygote()
            if zygote.serves(child_env):
                fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
                       errwrite if errwrite != -1 else 2]
                reply = zygote.ask({"op": "spawn", "argv": command, "env": child_env,
                                    "cwd": os.fspath(cwd) if cwd else os.getcwd(),
                                    "session": bool(start_new_session)}, fds)
                self.pid = reply["pid"]
                self._zygote = zygote
                self._child_created = True
                self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
                return
        super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                               startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread,
                               c2pwrite, errread, errwrite, restore_signals, gid, gids, uid,
                               umask, start_new_session, process_group)

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        if self._zygote is None:
            return super()._try_wait(wait_flags)
        while True:
            status = self._zygote.ask({"op": "poll", "pid": self.pid})["status"]
            if status is not None:
                return self.pid, status
            if wait_flags & os.WNOHANG:
                return 0, 0
            time.sleep(0.02)

    def _internal_poll(self, _deadstate=None, **_: object) -> int | None:  # noqa: ANN001
        if self._zygote is None:
            return super()._internal_poll(_deadstate)
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None:
                    pid, status = self._try_wait(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(status)
            except OSError:
                if _deadstate is not None:
                    self.returncode = _deadstate
            finally:
                self._waitpid_lock.release()
        return self.returncode


def install() -> None:
    """Route this process's ``subprocess.Popen`` (and so ``subprocess.run``) through here,
    unless ``TEST_ZYGOTE=0``."""
    if os.environ.get("TEST_ZYGOTE", "1") != "0":
        subprocess.Popen = ZygotePopen  # type: ignore[misc]


def uninstall() -> None:
    global _zygote
    subprocess.Popen = _REAL_POPEN  # type: ignore[misc]
    with _zygote_lock:
        if _zygote is not None and _zygote.pid == os.getpid():
            _zygote.close()
        _zygote = None
