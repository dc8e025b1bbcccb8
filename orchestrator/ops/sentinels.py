"""A local Redis Sentinel set for the failover tests and ``python -m bench.failover``.

A master, one replica and three sentinels (``redis-server --sentinel``, Debian's redis-server
package), each on a free port of 127.0.0.1 in a temporary directory, with a quick failover
(``down-after-milliseconds`` 1000): ``kill_master`` SIGKILLs the master (and, with
``with_sentinel``, the first sentinel: a host lost whole), ``wait_for_failover`` waits until
the sentinels name another master. Everything started here is stopped by ``close``; nothing
else is touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from drover.orchestrator.ops.services import free_port

__all__ = ["MASTER_NAME", "SentinelSet", "start_sentinel_set"]

MASTER_NAME = "drover-ha"
DOWN_AFTER_MS = 1000


@dataclass
class SentinelSet:
    """The processes of a local Sentinel set; ``url`` is what DROVER_REDIS_URL takes."""

    workdir: Path
    sentinel_ports: list[int]
    redis_ports: list[int]
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)
    master_name: str = MASTER_NAME

    @property
    def url(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{port}/0" for port in self.sentinel_ports)

    def env(self) -> dict[str, str]:
        return {"DROVER_REDIS_URL": self.url, "DROVER_SENTINEL_MASTER": self.master_name}

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_connect_timeout=1, socket_timeout=5)

    def master_port(self) -> int | None:
        """The master's port as a live sentinel names it (None when none answers)."""
        for port in self.sentinel_ports:
            if not self.alive(port):
                continue
            with contextlib.suppress(redis.RedisError), contextlib.closing(
                    self.client(port)) as client:
                addr = client.sentinel_get_master_addr_by_name(self.master_name)
                if isinstance(addr, tuple):  # (host, port); redis-py types a miss as a bool
                    return int(addr[1])
        return None

    def alive(self, port: int) -> bool:
        proc = self.procs.get(port)
        return proc is not None and proc.poll() is None

    def kill_master(self, with_sentinel: bool = False) -> int:
        """SIGKILL the master (and the first sentinel); returns the dead master's port."""
        port = self.master_port()
        if port is None:
            raise RuntimeError("no sentinel names a master")
        self._kill(port)
        if with_sentinel:
            self._kill(self.sentinel_ports[0])
        return port

    def _kill(self, port: int) -> None:
        proc = self.procs[port]
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def wait_for_failover(self, old_port: int, timeout: float = 60.0) -> int:
        """Until a sentinel names a master other than ``old_port`` that says it is one."""
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            seen = self.master_port()
            if seen is not None and seen != old_port and self.alive(seen):
                with contextlib.suppress(redis.RedisError), contextlib.closing(
                        self.client(seen)) as client:
                    if client.info("replication").get("role") == "master":
                        return seen
            time.sleep(0.1)
        raise TimeoutError(f"no failover within {timeout:g} s (the sentinels name {seen}; "
                           f"logs in {self.workdir})")

    def restart(self, port: int) -> None:
        """Start a killed Redis again; the sentinels make it a replica of the new master."""
        if self.alive(port):
            return
        if port in self.sentinel_ports:
            self.procs[port] = self._spawn_sentinel(port)
        else:
            self.procs[port] = self._spawn_redis(port, None)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # --- starting the processes ---------------------------------------------------------
    def _spawn_redis(self, port: int, replica_of: int | None) -> subprocess.Popen:
        binary = shutil.which("redis-server") or "redis-server"
        argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                "--appendonly", "no", "--dir", str(self.workdir),
                "--dbfilename", f"dump-{port}.rdb", "--logfile", str(self.workdir / f"{port}.log")]
        if replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(replica_of)]
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _spawn_sentinel(self, port: int) -> subprocess.Popen:
        conf = self.workdir / f"sentinel-{port}.conf"
        if not conf.exists():  # a restarted sentinel keeps what it learnt in its file
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"logfile {self.workdir / f'sentinel-{port}.log'}\n"
                f"sentinel monitor {self.master_name} 127.0.0.1 {self.redis_ports[0]} 2\n"
                f"sentinel down-after-milliseconds {self.master_name} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {self.master_name} 10000\n"
                f"sentinel parallel-syncs {self.master_name} 1\n")
        binary = shutil.which("redis-server") or "redis-server"
        return subprocess.Popen([binary, str(conf), "--sentinel"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait(what: str, check, timeout: float, where: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError, OSError):
            if check():
                return
        time.sleep(0.1)
    raise TimeoutError(f"{what} within {timeout:g} s (logs in {where})")


def start_sentinel_set(timeout: float = 60.0) -> SentinelSet:
    """Start a master, a replica and three sentinels; return once the sentinels see both."""
    if shutil.which("redis-server") is None:
        raise FileNotFoundError(
            "redis-server is not on PATH (Debian: apt-get install redis-server)")
    workdir = Path(tempfile.mkdtemp(prefix="drover-sentinel-"))
    ports: set[int] = set()
    while len(ports) < 5:
        ports.add(free_port())
    master, replica, *sentinels = sorted(ports)
    cluster = SentinelSet(workdir, sentinels, [master, replica])
    try:
        cluster.procs[master] = cluster._spawn_redis(master, None)
        _wait("the master did not answer", lambda: cluster.client(master).ping(), timeout,
              workdir)
        cluster.procs[replica] = cluster._spawn_redis(replica, master)
        _wait("the replica did not sync", lambda: cluster.client(replica).info(
            "replication").get("master_link_status") == "up", timeout, workdir)
        for port in sentinels:
            cluster.procs[port] = cluster._spawn_sentinel(port)

        def sentinels_ready() -> bool:
            for port in sentinels:
                with contextlib.closing(cluster.client(port)) as client:
                    state = client.sentinel_master(cluster.master_name)
                    if not isinstance(state, dict) or int(state.get("num-slaves", 0)) < 1 or int(
                            state.get("num-other-sentinels", 0)) < 2:
                        return False
            return True

        _wait("the sentinels did not find the replica and each other", sentinels_ready,
              timeout, workdir)
    except BaseException:
        cluster.close()
        raise
    return cluster
