"""(c) Celery's built-in `rate_limit`, 4 worker processes: what Celery users reach for.

One task per LLM call, so `rate_limit` counts calls: a sub-agent's turn calls the model,
runs the tools, and enqueues its next turn with the conversation in the task arguments; the
last turn records the outcome in Redis. Celery enforces `rate_limit` per worker process, so
it is set once to the key's requests/min divided by the number of workers and once to the
full limit (what a user who reads "rate_limit" as global writes; celery#5732). The sync SDK
client retries each call twice (its default). The worker side is configured from BENCH_*
environment variables.

Workers use Celery's default pool (prefork, 8 children each). With `--pool threads`, Celery
5.7 ran rate-limited tasks at exactly one per second per worker once its prefetch was used
up (the threads pool's blocking consumer loop moves a held task to the pool only between
broker polls): 4 calls/s in all whatever the rate_limit, which would make this contender
look worse than what users of the default pool get.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import Counter
from typing import Any

import anthropic
import redis
from celery import Celery

from bench.contenders.common import Outcome, RunContext, celery_workers, error_name
from bench.workload import assistant_turn, request_params, tool_results

TASK = "bench.llm_turn"


def make_app(redis_url: str, prefix: str) -> Celery:
    app = Celery("bench_celery_rate_limit", broker=redis_url)
    app.conf.update(
        task_serializer="json", accept_content=["json"], task_ignore_result=True,
        broker_transport_options={"global_keyprefix": f"{prefix}:celery:"},
        worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)
    return app


# --- the worker side -----------------------------------------------------------------------

app = make_app(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
               os.environ.get("BENCH_PREFIX", "bench"))
_client_lock = threading.Lock()
_sdk: anthropic.Anthropic | None = None
_redis: redis.Redis | None = None


def _client() -> anthropic.Anthropic:
    """One SDK client per worker process (its threads share the connection pool)."""
    global _sdk
    with _client_lock:
        if _sdk is None:
            _sdk = anthropic.Anthropic(base_url=os.environ["BENCH_SIM_URL"],
                                       api_key=os.environ["BENCH_API_KEY"])
        return _sdk


def _record(index: int, status: str) -> None:
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    _redis.hset(f"{os.environ['BENCH_PREFIX']}:done", str(index), status)


@app.task(name=TASK, rate_limit=os.environ.get("BENCH_RATE_LIMIT"))
def llm_turn(index: int, messages: list[dict[str, Any]]) -> None:
    try:
        reply = _client().messages.create(**request_params(messages))
    except anthropic.APIError as error:
        _record(index, f"lost:{error_name(error)}")
        return
    messages.append(assistant_turn(reply.content))
    follow_up = tool_results(messages[-1]["content"])
    if follow_up is None:
        _record(index, "ok")
        return
    messages.append(follow_up)
    llm_turn.apply_async((index, messages), queue=os.environ["BENCH_QUEUE"])


# --- the harness side ----------------------------------------------------------------------

def run(ctx: RunContext, per_worker_rpm: float, pool: str = "prefork") -> Outcome:
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    env = {"BENCH_PREFIX": ctx.prefix, "BENCH_REDIS_URL": ctx.redis_url,
           "BENCH_SIM_URL": ctx.sim_url, "BENCH_API_KEY": ctx.api_key, "BENCH_QUEUE": queue,
           "BENCH_RATE_LIMIT": f"{per_worker_rpm:g}/m"}
    sender = make_app(ctx.redis_url, ctx.prefix)
    done_key = f"{ctx.prefix}:done"
    r = redis.Redis.from_url(ctx.redis_url, decode_responses=True)
    tasks = ctx.workload.tasks
    with celery_workers("bench.contenders.celery_rate_limit", env, queue, ctx.workers,
                        ctx.concurrency, sender, pool=pool):
        started = time.monotonic()
        for i, task in enumerate(tasks):
            sender.send_task(TASK, (i, [{"role": "user", "content": task}]), queue=queue)
        while r.hlen(done_key) < len(tasks) and time.monotonic() - started < ctx.time_cap_s:
            time.sleep(0.05)
        makespan = time.monotonic() - started
    outcomes = r.hgetall(done_key)
    r.close()
    sender.close()
    errors = Counter(v.removeprefix("lost:") for v in outcomes.values() if v != "ok")
    if len(outcomes) < len(tasks):
        errors["TimeoutError (unfinished at the time cap)"] = len(tasks) - len(outcomes)
    lost = sum(errors.values())
    return Outcome(completed=len(tasks) - lost, lost=lost, makespan_s=makespan,
                   errors=dict(errors), extra={"rate_limit": env["BENCH_RATE_LIMIT"]},
                   started_at=started, finished_at=started + makespan)
