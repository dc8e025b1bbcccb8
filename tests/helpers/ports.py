"""Ports for the servers tests start in subprocesses.

A port the kernel picks with ``bind(0)`` is free only until the socket closes: another xdist
worker's ``bind(0)``, or any outgoing connection, may take it before the subprocess binds it
(a full run: "Address already in use", then a minute waiting on a server that had exited).
Ports here come from below Linux's ephemeral range, so no outgoing connection takes them, and
each is claimed with a lock file held until this process exits, so no other test process (an
xdist worker, or a second run on the same machine) hands it out too.
"""

from __future__ import annotations

import fcntl
import os
import socket
import tempfile
import threading
from pathlib import Path
from typing import IO

__all__ = ["free_port"]

_FIRST, _LAST = 20000, 32000  # below ip_local_port_range's default 32768
_LOCKS = Path(tempfile.gettempdir()) / "drover-test-ports"
_held: list[IO[bytes]] = []  # open for the process's life: the kernel drops the locks at exit
_guard = threading.Lock()
_next = _FIRST + (os.getpid() * 7) % (_LAST - _FIRST)  # processes start apart, then probe on


def _claim(port: int) -> bool:
    handle = open(_LOCKS / f"{port}.lock", "ab")  # noqa: SIM115 (held open on purpose)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return False
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:  # a server outside the tests holds it
            handle.close()
            return False
    _held.append(handle)
    return True


def free_port() -> int:
    """A port on 127.0.0.1 no other test process will be given while this one runs."""
    global _next
    _LOCKS.mkdir(exist_ok=True)
    with _guard:
        for _ in range(_LAST - _FIRST):
            port, _next = _next, _FIRST + (_next + 1 - _FIRST) % (_LAST - _FIRST)
            if _claim(port):
                return port
    raise RuntimeError(f"no free port in {_FIRST}-{_LAST}: remove {_LOCKS} if no test runs")
