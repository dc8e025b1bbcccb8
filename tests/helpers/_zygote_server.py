"""The test processes' zygote: a Python that has imported the heavy libraries once (the
anthropic SDK alone is 1.7 s of CPU and 3,300 modules) and forks a fresh process for each
``python -m celery ...``, ``python -m drover.orchestrator.cli ...``, ``python -m bench...``
or ``python script.py`` a test starts, which then runs that module or script as ``python``
would (tests/helpers/zygote.py says why and how).

Run as a script, never imported: ``python _zygote_server.py FD``, FD one end of a
SOCK_SEQPACKET socket pair. Single-threaded (it forks), and it imports no drover module:
drover reads its settings from the environment, which each child gets from its test. Each
request is one JSON message, with the child's stdin, stdout and stderr as passed fds for
``spawn``:

- ``{"op": "spawn", "argv": [...], "env": {...}, "cwd": "...", "session": bool}``
  -> ``{"pid": N}``
- ``{"op": "poll", "pid": N}`` -> ``{"status": raw wait status or null}``
"""

from __future__ import annotations

import json
import os
import socket
import sys

PRELOAD = ("anthropic", "httpx", "redis", "kombu.transport.redis", "celery",
           "celery.bin.celery", "celery.apps.worker", "celery.worker.worker",
           "celery.concurrency.thread", "celery.concurrency.prefork", "click",
           "pydantic_settings")
MAX_MESSAGE = 1 << 20
_OWN_FRAMES = (os.path.abspath(__file__), "<frozen runpy>")


def _child(request: dict, fds: list[int], sock: socket.socket, ready: int) -> None:
    """In the forked child: become the process the test asked for, say so on ``ready``
    (the test may signal its process group the moment it has the pid), then run its
    module."""
    import runpy
    import signal

    sock.close()
    if request["session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.write(ready, b"1")
    os.closerange(3, 1 << 16)
    # As a fresh interpreter has them (SIGPIPE stays ignored, as Python sets it at start: a
    # write to a socket the broker closed must raise, not kill the worker).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    env = request["env"]
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    argv = request["argv"]  # [python, "-m", module, *args] or [python, script, *args]
    script = None if argv[1] == "-m" else os.path.abspath(argv[1])
    # What ``python -m`` and ``python script`` put first: the working folder, the script's.
    sys.path.insert(0, request["cwd"] if script is None else os.path.dirname(script))
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[1:1] = [p for p in extra if p not in sys.path]
    if env.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    sys.argv = [argv[2], *argv[3:]] if script is None else argv[1:]
    code: object = 0
    try:
        if script is None:
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code
    except KeyboardInterrupt:
        code = 130
    except BaseException as error:  # noqa: BLE001 (as the interpreter would: exit 1)
        # The traceback a fresh interpreter prints: from the script's or module's own frame
        # (a test reads how long a user's traceback is), not this file's and runpy's.
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FRAMES:
            tb = tb.tb_next
        sys.excepthook(type(error), error.with_traceback(tb), tb)
        code = 1
    # Exit as the interpreter would, atexit handlers included (a worker's last spans, logs).
    raise SystemExit(code)


def main() -> None:
    # Not this script's folder (tests/helpers, where flower.py would shadow Flower): each
    # child puts its own working folder first, as ``python -m`` does.
    del sys.path[0]
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    # What was imported is kept out of every collection, the children's included: a child's
    # collections, above all the last one as it exits, otherwise walk the whole preloaded heap
    # and write to each object's header, copying every page of it from the zygote (measured,
    # `drover stats --plot` at a load of 8: 0.83-0.88 s of CPU from its plot written to its
    # exit, more than the command's own 0.75 s, and 3.5-4.5 s of wall; frozen: 0.16-0.20 s
    # and 0.3-0.6 s); at a load of 21, 13 s of wall of the child's 35-80 s were that exit.
    import gc

    gc.freeze()
    sock = socket.socket(fileno=int(sys.argv[1]))
    sock.settimeout(0.2)
    statuses: dict[int, int] = {}
    while True:
        while True:  # reap whatever ended, keeping its status for the test's poll
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            statuses[pid] = status
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 3)
        except TimeoutError:
            continue
        if not data:
            return  # the test process is gone
        request = json.loads(data)
        if request["op"] == "spawn":
            wait_for, ready = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(wait_for)
                _child(request, fds, sock, ready)
            os.close(ready)
            os.read(wait_for, 1)  # empty if the child died setting itself up
            os.close(wait_for)
            for fd in fds:
                os.close(fd)
            reply: dict = {"pid": pid}
        else:
            reply = {"status": statuses.get(request["pid"])}
        sock.send(json.dumps(reply).encode())


if __name__ == "__main__":
    main()
