"""First contact with the services drover needs, and local ones for the demo and the tests.

``check_services`` (from ``drover.workers.connections.preflight``) is what every CLI command
that needs Redis or the broker runs first.

``ensure_redis`` uses the Redis at the given URL when one answers there; otherwise it starts
``redis-server`` from PATH on a free port in a temporary directory; when there is no
``redis-server`` either, it serves fakeredis over TCP (pure Python, Lua through ``lupa``).
Whatever it starts it stops again, so a Redis it did not start is never flushed or shut down.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from drover.workers.connections.preflight import (
    FIRST_CONTACT_TIMEOUT_S,
    Unreachable,
    broker_problem,
    check_services,
    redis_answers,
    redis_problem,
)

__all__ = ["FIRST_CONTACT_TIMEOUT_S", "RedisService", "Unreachable", "broker_problem",
           "check_services", "ensure_redis", "free_port", "redis_answers", "redis_problem",
           "redis_service", "start_fakeredis", "start_redis_server"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisService:
    url: str
    kind: str  # "existing" | "redis-server" | "fakeredis"
    stop: object = None  # a callable that stops what was started, or None

    def close(self) -> None:
        if callable(self.stop):
            self.stop()
            self.stop = None


def start_redis_server(host: str = "127.0.0.1", port: int | None = None) -> RedisService:
    """Start a private ``redis-server`` (no persistence) on a free port; raise if none on PATH."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError(
            "redis-server is not on PATH (Debian: apt-get install redis-server)")
    port = port or free_port(host)
    workdir = tempfile.mkdtemp(prefix="drover-redis-")
    proc = subprocess.Popen(
        [binary, "--bind", host, "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", workdir, "--logfile", f"{workdir}/redis.log"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"redis://{host}:{port}/0"

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)

    deadline = time.monotonic() + 10
    while not redis_answers(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop()
            raise RuntimeError(f"redis-server did not start on {host}:{port}; see {workdir}")
        time.sleep(0.05)
    return RedisService(url=url, kind="redis-server", stop=stop)


def start_fakeredis(host: str = "127.0.0.1") -> RedisService:
    """Serve fakeredis over TCP in a thread: the fallback when no redis-server is installed."""
    from fakeredis import TcpFakeServer  # imported late: only the fallback needs it

    port = free_port(host)
    server = TcpFakeServer((host, port), server_type="redis")
    thread = threading.Thread(target=server.serve_forever, name="fakeredis", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return RedisService(url=f"redis://{host}:{port}/0", kind="fakeredis", stop=stop)


def ensure_redis(url: str, *, known_down: bool = False) -> RedisService:
    """A Redis that answers: the one at ``url``, else a private redis-server, else fakeredis.

    ``known_down``: the caller has just found that nothing answers at ``url``."""
    if not known_down and redis_answers(url):
        return RedisService(url=url, kind="existing")
    host = urlsplit(url).hostname or "127.0.0.1"
    if host not in ("127.0.0.1", "localhost", "::1"):
        host = "127.0.0.1"
    if shutil.which("redis-server"):
        return start_redis_server(host)
    return start_fakeredis(host)


@contextlib.contextmanager
def redis_service(url: str) -> Iterator[RedisService]:
    service = ensure_redis(url)
    try:
        yield service
    finally:
        service.close()
