"""What every contender gets (where the simulator is, which workload) and gives back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.workload import Workload, assistant_turn, request_params, tool_results

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RunContext:
    workload: Workload
    sim_url: str
    redis_url: str
    api_key: str  # a key of this run's own: the simulator keeps buckets per key
    prefix: str   # Redis key prefix of this run's own (deleted afterwards)
    workers: int = 4
    concurrency: int = 8  # threads per worker process (b's semaphore: workers x concurrency)
    time_cap_s: float = 600.0  # sub-agents unfinished by then count as lost ("timed out")


@dataclass
class Outcome:
    completed: int
    lost: int
    makespan_s: float
    errors: dict[str, int] = field(default_factory=dict)  # what the lost ones died of
    extra: dict[str, Any] = field(default_factory=dict)
    # time.monotonic() at the start and the end of the makespan; CLOCK_MONOTONIC is one clock
    # for every process on the host, so these compare with the simulator's own timestamps.
    started_at: float = 0.0
    finished_at: float = 0.0


async def subagent_async(create: Any, task: str) -> int:
    """The loop users write: call, run the tools, call again until the model is done."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    calls = 0
    while True:
        reply = await create(**request_params(messages))
        calls += 1
        messages.append(assistant_turn(reply.content))
        follow_up = tool_results(messages[-1]["content"])
        if follow_up is None:
            return calls
        messages.append(follow_up)


async def gather_capped(coros: list[Any], cap_s: float) -> list[Any]:
    """``asyncio.gather(..., return_exceptions=True)``, but unfinished ones become TimeoutError."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    await asyncio.wait(tasks, timeout=cap_s)
    out: list[Any] = []
    for task in tasks:
        if not task.done():
            task.cancel()
            out.append(TimeoutError("unfinished at the time cap"))
        else:
            out.append(task.exception() or task.result())
    return out


async def gather_outcome(ctx: RunContext, create: Any) -> Outcome:
    """Run every sub-agent with ``create`` as its messages.create, all at once; tally them."""
    started = time.monotonic()
    results = await gather_capped([subagent_async(create, task) for task in ctx.workload.tasks],
                                  ctx.time_cap_s)
    makespan = time.monotonic() - started
    lost = [r for r in results if isinstance(r, BaseException)]
    return Outcome(completed=len(results) - len(lost), lost=len(lost), makespan_s=makespan,
                   errors=dict(Counter(error_name(e) for e in lost)), started_at=started,
                   finished_at=started + makespan)


def error_name(error: BaseException) -> str:
    status = getattr(error, "status_code", None)
    return f"{type(error).__name__}{f' {status}' if status else ''}"


def peak_rss_kb(pid: int) -> int:
    """Peak resident set size of a process (VmHWM), in kB; 0 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) a process has used so far; 0.0 if unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def delete_prefix(redis_url: str, prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    with contextlib.closing(client):
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 1000):
            client.delete(*keys[i:i + 1000])


@contextlib.contextmanager
def celery_workers(app_path: str, env: dict[str, str], queue: str, count: int,
                   concurrency: int, ping_app: Any, pool: str = "threads",
                   log_dir: Path | None = None) -> Iterator[list[subprocess.Popen]]:
    """`count` real `celery worker` processes on `queue`; yields once all answer a ping."""
    procs: list[subprocess.Popen] = []
    names = [f"bench{i}-{uuid.uuid4().hex[:6]}@localhost" for i in range(count)]
    full_env = {**os.environ, **env}
    try:
        for name in names:
            log: Any = subprocess.DEVNULL
            if log_dir is not None:
                log = open(log_dir / f"{name.split('@')[0]}.log", "w")  # noqa: SIM115
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", app_path, "worker", "--pool", pool,
                 "--concurrency", str(concurrency), "--queues", queue, "--loglevel", "WARNING",
                 "--without-gossip", "--without-mingle", "-n", name],
                cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
        deadline = time.monotonic() + 90
        while True:
            replies = ping_app.control.ping(destination=names, timeout=1.0) or []
            if len(replies) >= count:
                break
            dead = [p for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"{app_path}: {len(replies)}/{count} workers answered "
                                   f"({len(dead)} exited)")
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


class SimProcess:
    """`python -m drover.simulator` in a process of its own (its own interpreter, off the harness's
    GIL), driven over its control endpoints; a context manager."""

    def __init__(self, config: Any) -> None:
        from drover.orchestrator.ops.services import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "drover.simulator", "--port", str(self.port)]
        for name, value in config.to_dict().items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + name.replace("_", "-"))
            elif isinstance(value, list | tuple | dict):  # JSON on the command line
                if value:  # empty: the simulator's default
                    args += [flag, json.dumps(value)]
            elif value is not None:
                args += [flag, str(value)]
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening" not in line:
            self.close()
            raise RuntimeError(f"the simulator did not start: {line!r}")

    def _call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data,
                                         method="GET" if body is None else "POST",
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    def stats(self) -> dict[str, Any]:
        return self._call("/_sim/stats")

    def reset(self) -> None:
        self._call("/_sim/reset", {})

    def configure(self, **changes: Any) -> dict[str, Any]:
        return self._call("/_sim/config", changes)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
