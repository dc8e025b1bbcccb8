"""Issue 50's goal: a team's own sub-agents (``@drover.subagent``, ``bench/own_agents.py``: a
plan, 1-6 checks and a summary, 3-8 calls each) as a drover job at a binding token limit, while
another process fires calls at once through ``drover.AsyncAnthropic`` (``AsyncOpenAI``) on the
same key; then a worker killed -9 mid-job.

    python -m bench.own_code [--provider anthropic,openai] [--n 150] [--burst 100] [--quick]

Two worker processes of 8 threads against the simulator (bursts of 1 s, 0.4 s latency). Per
provider, two runs:

- **limits**: the job and, 5 s into it, the other process's burst. Printed: sub-agents ok,
  the burst's calls ok, the simulator's 429s, the makespan (the simulator's first acceptance to
  its last answer) and its ratio to the lower bound the binding limit sets on the combined
  demand (what that limit counted of every call, the job's and the burst's, less one bucket,
  over its rate; or the requests at the request rate, whichever is longer).
- **kill**: the job alone; once a third of its calls are answered, one of the two workers is
  killed (SIGKILL). Printed: sub-agents ok, the calls the simulator took twice (the same body:
  sent again by a resumed sub-agent) against the calls in flight at the kill, and the job's
  usage against what the simulator billed.

The machine's load is printed with each run: the figures of a busy machine are recorded as such.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
import uuid
from typing import Any

from bench.recovery import kill_workers, spawn_worker
from drover.simulator import SimConfig, SimulatorServer

RPM, BURST_S, THREADS = 6000, 1, 8
ITPM, OTPM = 200_000, 10_000_000    # Anthropic: the input binds
TPM = 400_000                       # OpenAI: input + max_tokens per call
MODEL = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-sim-1"}


def environment(provider: str, sim: SimulatorServer) -> dict[str, str]:
    tag = uuid.uuid4().hex[:6]
    env = {**os.environ, "DROVER_KEY_PREFIX": f"bench-own-{tag}",
           "DROVER_QUEUE": f"bench-own-{tag}", "DROVER_KEY_ALIAS": f"bench-own-{tag}",
           "DROVER_PROVIDER": provider, "DROVER_RPM": str(RPM),
           "DROVER_BURST_SECONDS": str(BURST_S), "DROVER_MODEL": MODEL[provider],
           "DROVER_TOOL_MODULES": "bench.own_agents"}
    if provider == "openai":
        env.update(DROVER_OPENAI_BASE_URL=sim.url + "/v1", DROVER_OPENAI_API_KEY="sk-bench",
                   OPENAI_API_KEY="sk-bench", DROVER_TPM=str(TPM))
    else:
        env.update(DROVER_ANTHROPIC_BASE_URL=sim.url, ANTHROPIC_API_KEY="sk-bench",
                   DROVER_ITPM=str(ITPM), DROVER_OTPM=str(OTPM))
    return env


def inputs(n: int, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"id": i, "steps": rng.randint(1, 6)} for i in range(n)]


def lower_bound(provider: str, stats: dict[str, Any], max_tokens: int) -> float:
    """The shortest time the binding limit allows for what the simulator took: the tokens
    that limit counted, less the one bucket a run starts with, at its rate; or the requests
    at the request rate."""
    counted_in = stats["billed"]["input_tokens"]
    if provider == "openai":
        counted, rate = counted_in + stats["accepted"] * max_tokens, TPM / 60
    else:
        counted, rate = counted_in, ITPM / 60
    return max((counted - rate * BURST_S) / rate, stats["accepted"] / (RPM / 60))


def wait_for_slots(env: dict[str, str], workers: int, timeout_s: float = 180) -> None:
    """Until ``workers`` workers have reported their slots to the fair-share window (so the
    job's clock starts with both up, on a busy machine too)."""
    import redis

    r = redis.Redis.from_url(env.get("DROVER_REDIS_URL", "redis://127.0.0.1:6379/0"))
    key = f"{env['DROVER_KEY_PREFIX']}:fs:{{{env['DROVER_QUEUE']}}}:slots"
    deadline = time.monotonic() + timeout_s
    try:
        while len(r.hgetall(key)) < workers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{workers} workers did not come up within {timeout_s:g} s")
            time.sleep(0.2)
    finally:
        r.close()


def burst(n: int, provider: str) -> None:
    """The other process: ``n`` calls at once through drover's limited client on the same
    key; prints one JSON line (ok, the errors by type)."""
    import drover
    from bench.own_agents import CONTEXT, MAX_TOKENS

    async def main() -> dict[str, Any]:
        if provider == "openai":
            client: Any = drover.AsyncOpenAI()

            async def one(i: int) -> Any:
                return await client.chat.completions.create(
                    model=MODEL[provider], max_completion_tokens=MAX_TOKENS,
                    messages=[{"role": "system", "content": CONTEXT},
                              {"role": "user", "content": f"Notebook question {i}."}])
        else:
            client = drover.AsyncAnthropic()

            async def one(i: int) -> Any:
                return await client.messages.create(
                    model=MODEL[provider], max_tokens=MAX_TOKENS, system=CONTEXT,
                    messages=[{"role": "user", "content": f"Notebook question {i}."}])

        outcomes = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
        errors: dict[str, int] = {}
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                errors[type(outcome).__name__] = errors.get(type(outcome).__name__, 0) + 1
        return {"ok": n - sum(errors.values()), "errors": errors}

    print(json.dumps(asyncio.run(main())), flush=True)


def run(provider: str, n: int, burst_n: int, kill: bool) -> dict[str, Any]:
    from bench.own_agents import MAX_TOKENS

    sim = SimulatorServer(SimConfig(
        provider=provider, seed=1, rpm=RPM, burst_s=BURST_S, latency_mean_s=0.4,
        latency_p95_s=0.6, tool_turns=0, output_tokens_mean=80,
        **({"tpm": TPM} if provider == "openai" else {"itpm": ITPM, "otpm": OTPM}))).start()
    env = environment(provider, sim)
    os.environ.clear()
    os.environ.update(env)
    from drover import JobSpec, submit  # with the environment above
    from drover.config import get_settings

    get_settings.cache_clear()  # this run's provider, prefix and queue, not the last run's
    tag = env["DROVER_QUEUE"].rsplit("-", 1)[-1]
    workers = [spawn_worker(env, f"own{i}-{tag}", threads=THREADS) for i in range(2)]
    other: subprocess.Popen | None = None
    try:
        wait_for_slots(env, 2)
        items = inputs(n)
        handle = submit(JobSpec(subagent="inspect_berth", inputs=items))
        calls = sum(item["steps"] + 2 for item in items)
        out: dict[str, Any] = {"provider": provider, "n": n, "calls_planned": calls}
        if burst_n:
            time.sleep(5)
            other = subprocess.Popen([sys.executable, "-m", "bench.own_code", "--burst-child",
                                      str(burst_n), "--provider", provider], env=env,
                                     stdout=subprocess.PIPE, text=True)
        if kill:
            while sim.stats()["accepted"] < calls // 3:
                time.sleep(0.05)
            out["in_flight_at_kill"] = sim.stats()["in_flight"]
            kill_workers(workers[:1])
        result = handle.wait(timeout=1800)
        if other is not None:
            line = other.communicate(timeout=600)[0].strip().splitlines()[-1]
            out["burst"] = json.loads(line)
        stats = sim.stats()
        busy = stats["last_done_ts"] - stats["first_accept_ts"]
        bound = lower_bound(provider, stats, MAX_TOKENS)
        usage = result.usage
        out.update(
            ok=result.counts["ok"], failed=[r.error for r in result.results if r.error][:3],
            accepted=stats["accepted"], sent_twice=stats["duplicate_accepted"],
            n429=stats["rejected_429"], busy_s=round(busy, 1), bound_s=round(bound, 1),
            ratio=round(busy / bound, 3),
            usage={"calls": usage.calls, "unanswered": usage.unanswered_calls,
                   "input": usage.input_tokens + usage.cache_creation_input_tokens,
                   "output": usage.output_tokens,
                   "unanswered_input": usage.unanswered_input_tokens,
                   "unanswered_output": usage.unanswered_output_tokens},
            billed={"requests": stats["billed"]["requests"],
                    "input": stats["billed"]["input_tokens"],
                    "output": stats["billed"]["output_tokens"]},
            load=round(os.getloadavg()[0], 1))
        if kill:  # a worker's sub-agents waited for its heartbeat to lapse: no pace figure
            for name in ("busy_s", "bound_s", "ratio"):
                out.pop(name)
        return out
    finally:
        if other is not None and other.poll() is None:
            other.kill()
        kill_workers(workers)
        sim.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", default="anthropic,openai")
    parser.add_argument("--n", type=int, default=150)
    parser.add_argument("--burst", type=int, help="calls of the other process (100; 10 quick)")
    parser.add_argument("--quick", action="store_true", help="12 sub-agents, a burst of 10")
    parser.add_argument("--burst-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.burst_child is not None:
        burst(args.burst_child, args.provider)
        return
    n = 12 if args.quick else args.n
    burst_n = args.burst if args.burst is not None else 10 if args.quick else 100
    for provider in args.provider.split(","):
        for kill in (False, True):
            out = run(provider, n, 0 if kill else burst_n, kill)
            print(f"{provider} {'kill' if kill else 'limits'}: {json.dumps(out)}", flush=True)


if __name__ == "__main__":
    main()
