"""Three hosts of our own on this machine: Linux network namespaces joined by veth pairs on a
bridge. Host A runs Redis and the simulator; hosts B and C run a Celery worker each and reach
A only over the namespaces' addresses (nothing in a namespace can see this machine's
loopback). A 120-sub-agent job, submitted from host B, must stay inside the provider's
limits although two hosts share them, and must still complete when host C's worker is
killed in the middle of it.

Needs root and iproute2 (``ip netns``); skipped, saying why, where either is missing.
Every namespace and process the test makes is removed again, also when it fails; namespaces
left behind by a test run that was itself killed are removed by the next run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import ROOT, wait_until

NS_PREFIX = "drovertest-"
SUBNET = "10.213.7"  # inside our own namespaces only: no route to it exists outside them
REDIS_PORT = 6379
SIM_PORT = 8080
LIMITS = {"rpm": 600, "itpm": 80_000, "otpm": 40_000}  # bind: 32 slots could send far more
SUBAGENTS = 120
KILL_AFTER = 30  # finished sub-agents before host C's worker is killed


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=30)


def _why_not() -> str | None:
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (Debian: apt-get install iproute2)"
    if shutil.which("redis-server") is None:
        return "redis-server is not installed: host A needs one"
    probe = f"{NS_PREFIX}probe-{os.getpid()}"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is not allowed here: {made.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def _remove_namespace(name: str) -> None:
    pids = _run("ip", "netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _run("ip", "netns", "del", name, check=False)


def _sweep_leftovers() -> None:
    """Namespaces of earlier runs whose pytest process is gone (it was killed, say)."""
    listed = _run("ip", "netns", "list", check=False).stdout
    for name in re.findall(rf"^({NS_PREFIX}(\d+)-\w+)", listed, flags=re.M):
        full, pid = name
        if not Path(f"/proc/{pid}").exists():
            _remove_namespace(full)


@dataclass
class Hosts:
    """Three namespaces on one bridge, and the processes started in them."""

    names: dict[str, str]
    address: dict[str, str]
    logs: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, host: str, *cmd: str, env: dict[str, str] | None = None
              ) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 (closed by the child's end)
        proc = subprocess.Popen(["ip", "netns", "exec", self.names[host], *cmd], cwd=ROOT,
                                env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def run(self, host: str, *cmd: str, env: dict[str, str] | None = None,
            timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.names[host], *cmd], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=timeout)

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.kill(name, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(name, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    reason = _why_not()
    if reason:
        pytest.skip(f"several hosts cannot be made on this machine: {reason}")
    _sweep_leftovers()
    tag = uuid.uuid4().hex[:6]
    names = {h: f"{NS_PREFIX}{os.getpid()}-{tag}{h}" for h in "abc"}
    address = {h: f"{SUBNET}.{i}" for i, h in enumerate("abc", start=1)}
    made = Hosts(names, address, tmp_path)
    try:
        for ns in names.values():
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        a = names["a"]
        # Host A holds the bridge (the "switch"); B and C hang on it by a veth pair each,
        # created straight inside the namespaces, so nothing of it appears on this machine.
        _run("ip", "-n", a, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", a, "link", "set", "br0", "up")
        _run("ip", "-n", a, "addr", "add", f"{address['a']}/24", "dev", "br0")
        for h in "bc":
            _run("ip", "link", "add", "eth0", "netns", names[h], "type", "veth",
                 "peer", "name", f"to-{h}", "netns", a)
            _run("ip", "-n", a, "link", "set", f"to-{h}", "master", "br0")
            _run("ip", "-n", a, "link", "set", f"to-{h}", "up")
            _run("ip", "-n", names[h], "addr", "add", f"{address[h]}/24", "dev", "eth0")
            _run("ip", "-n", names[h], "link", "set", "eth0", "up")
        yield made
    finally:
        made.stop_all()
        for ns in names.values():
            _remove_namespace(ns)
        left = _run("ip", "netns", "list", check=False).stdout
        assert not any(ns in left for ns in names.values()), left


# The orchestrator, run on host B: submit, report progress as JSON lines, wait, then report
# the result and what the simulator saw.
DRIVER = r"""
import json, sys, time, urllib.request
from drover import JobSpec, submit
n = int(sys.argv[1]); sim = sys.argv[2]
handle = submit(JobSpec(subtasks=[f"Survey market segment {i}" for i in range(n)],
                        max_tokens=150, tools=["lookup_fact"]))
print(json.dumps({"job": handle.id}), flush=True)
while handle.result() is None:
    print(json.dumps({"progress": handle.progress()}), flush=True)
    time.sleep(0.5)
result = handle.wait()
stats = json.load(urllib.request.urlopen(sim + "/_sim/stats", timeout=10))
stats.pop("timeline", None)
print(json.dumps({"result": {"status": result.status, "counts": result.counts,
                             "indexes": [r.index for r in result.results],
                             "calls": result.usage.calls},
                  "sim": stats}), flush=True)
"""


def test_two_worker_hosts_share_the_limits_and_survive_losing_one(hosts: Hosts):
    a = hosts.address["a"]
    hosts.start("redis", "a", "redis-server", "--bind", a, "--port", str(REDIS_PORT),
                "--save", "", "--appendonly", "no", "--protected-mode", "no")
    hosts.start("sim", "a", sys.executable, "-m", "drover.simulator", "--host", a,
                "--port", str(SIM_PORT), "--rpm", str(LIMITS["rpm"]),
                "--itpm", str(LIMITS["itpm"]), "--otpm", str(LIMITS["otpm"]),
                "--burst-s", "10", "--latency-mean-s", "0.15", "--latency-p95-s", "0.4",
                "--tool-turns", "1", "--tools-per-turn", "1", "--output-tokens-mean", "60",
                "--seed", "5")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DROVER_")},
        "DROVER_REDIS_URL": f"redis://{a}:{REDIS_PORT}/0",
        "DROVER_ANTHROPIC_BASE_URL": f"http://{a}:{SIM_PORT}",
        "ANTHROPIC_API_KEY": "sk-multihost-not-a-secret",
        "DROVER_KEY_PREFIX": "drover-multihost", "DROVER_QUEUE": "multihost",
        "DROVER_RPM": str(LIMITS["rpm"]), "DROVER_ITPM": str(LIMITS["itpm"]),
        "DROVER_OTPM": str(LIMITS["otpm"]), "DROVER_BACKOFF_BASE_S": "0.2",
    }  # recovery with the default settings: heartbeats, not a short visibility timeout
    # Nothing on host B can reach this machine's Redis: the namespaces' addresses are all
    # there is, so whatever the job does goes over them.
    probe = ("import redis; r = redis.Redis(host='127.0.0.1', port=6379, "
             "socket_connect_timeout=1)\ntry:\n r.ping(); print('reachable')\n"
             "except Exception:\n print('unreachable')")
    assert hosts.run("b", sys.executable, "-c", probe).stdout.strip() == "unreachable"
    ping = f"import redis; print(redis.Redis(host='{a}', port={REDIS_PORT}).ping())"
    wait_until("Redis on host A, from host B",
              lambda: hosts.run("b", sys.executable, "-c", ping).stdout.strip() == "True")
    wait_until("the simulator on host A", lambda: "listening" in hosts.log("sim"))

    for h in "bc":
        hosts.start(f"worker-{h}", h, sys.executable, "-m", "celery", "-A", "drover.workers.app",
                    "worker", "--pool", "threads", "--concurrency", "16", "--queues",
                    "multihost", "--loglevel", "INFO", "--without-gossip",
                    "--without-mingle", "-n", f"worker@host-{h}", env=env)
    for h in "bc":
        wait_until(f"the worker on host {h}", lambda h=h: "ready." in hosts.log(f"worker-{h}"))

    driver = subprocess.Popen(
        ["ip", "netns", "exec", hosts.names["b"], sys.executable, "-c", DRIVER,
         str(SUBAGENTS), f"http://{a}:{SIM_PORT}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    hosts.procs["driver"] = driver
    killed_at = None
    final = None
    assert driver.stdout is not None
    for line in driver.stdout:
        message = json.loads(line)
        if "progress" in message and killed_at is None:
            done = message["progress"]["total"] - message["progress"]["pending"]
            if message["progress"]["total"] and done >= KILL_AFTER:
                hosts.kill("worker-c")  # kill -9, mid-job: its tasks are not acked
                killed_at = done
        if "result" in message:
            final = message
    driver.wait(timeout=60)
    assert final is not None, driver.stderr.read() if driver.stderr else ""
    assert killed_at is not None and killed_at < SUBAGENTS, "the job ended before the kill"

    result, sim = final["result"], final["sim"]
    assert result["status"] == "done"
    assert result["indexes"] == list(range(SUBAGENTS))
    assert result["counts"]["ok"] == SUBAGENTS
    # The provider never had to refuse anything, and no minute went over a limit.
    assert sim["rejected_429"] == 0 and sim["spend_cap_429"] == 0
    assert sim["max_60s"]["requests"] <= LIMITS["rpm"]
    assert sim["max_60s"]["input_tokens"] <= LIMITS["itpm"]
    assert sim["max_60s"]["output_tokens"] <= LIMITS["otpm"]
    assert sim["accepted"] >= 2 * SUBAGENTS  # a tool turn and a final answer each

    # Both worker hosts did calls (one line per call outcome), so they shared the limits.
    calls = {h: hosts.log(f"worker-{h}").count("llm call outcome=ok ") for h in "bc"}
    assert calls["b"] > 0 and calls["c"] > 0, calls
    print(f"killed host C's worker after {killed_at} sub-agents; calls by host {calls}; "
          f"provider: {sim['accepted']} accepted, busiest minute {sim['max_60s']}")
    assert "sk-multihost-not-a-secret" not in hosts.log("worker-b") + hosts.log("worker-c")
