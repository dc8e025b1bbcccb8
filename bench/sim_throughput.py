"""Simulator throughput: requests/s of `python -m drover.simulator` with no limits and no latency.

The simulator runs in a subprocess (its own interpreter and core), and this process drives
it over loopback with many concurrent aiohttp connections, a fixed number of requests and
a hard time cap. Every body is distinct, like a fan-out of sub-agents.

    python -m bench.sim_throughput [--requests 5000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_simulator(port: int, extra: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "drover.simulator", "--port", str(port), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "simulator listening on http://..." once bound
    if "listening" not in line:
        proc.kill()
        raise RuntimeError(f"simulator did not start: {line!r}")
    return proc


async def drive(url: str, total: int, concurrency: int, deadline_s: float
                ) -> tuple[Counter[int], float]:
    statuses: Counter[int] = Counter()
    next_index = 0
    headers = {"x-api-key": "sk-bench", "anthropic-version": "2023-06-01",
               "content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    start = time.perf_counter()
    stop_at = start + deadline_s
    async with aiohttp.ClientSession(connector=connector) as session:
        async def worker() -> None:
            nonlocal next_index
            while next_index < total and time.perf_counter() < stop_at:
                i = next_index
                next_index += 1
                body = json.dumps({"model": "claude-sim", "max_tokens": 256, "messages": [
                    {"role": "user", "content": f"Sub-agent {i}: research topic number {i}"}]})
                async with session.post(url + "/v1/messages", data=body, headers=headers) as resp:
                    await resp.read()
                    statuses[resp.status] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--deadline-s", type=float, default=120.0, help="hard cap on the run")
    parser.add_argument("--sim-arg", action="append", default=[],
                        help="extra simulator flag, e.g. --sim-arg=--rpm=100000")
    args = parser.parse_args(argv)
    port = free_port()
    proc = start_simulator(port, args.sim_arg)
    url = f"http://127.0.0.1:{port}"
    try:
        # Warm-up: connections, imports and code paths, not counted.
        asyncio.run(drive(url, 200, args.concurrency, 30.0))
        statuses, elapsed = asyncio.run(drive(url, args.requests, args.concurrency,
                                              args.deadline_s))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    done = sum(statuses.values())
    print(f"machine: nproc={os.cpu_count()} python={sys.version.split()[0]}")
    print(f"requests={done} concurrency={args.concurrency} elapsed={elapsed:.2f}s "
          f"statuses={dict(statuses)}")
    print(f"throughput: {done / elapsed:.0f} requests/s")
    return 0 if statuses.get(200, 0) == done == args.requests else 1


if __name__ == "__main__":
    sys.exit(main())
