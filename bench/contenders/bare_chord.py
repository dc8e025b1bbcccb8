"""The baselines of `bench/overhead.py`: bare Celery chords of no-op tasks, and of tasks that
each make one plain SDK call (the same request a drover sub-agent makes, sync client).

Its app has drover's own Celery configuration (`drover.config.celery.celery_config`: JSON, late
acks, prefetch 1, Redis broker and result backend, drover's key prefix), so the difference
to a drover job is drover's work, not Celery settings. Workers run
`celery -A bench.contenders.bare_chord worker`; the harness sends by task name.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import anthropic
from celery import Celery


def make_app() -> Celery:
    from drover.config import get_settings
    from drover.config.celery import celery_config

    app = Celery("bench_bare_chord")
    app.config_from_object(celery_config(get_settings()))
    return app


app = make_app()


@app.task(name="bench.noop")
def noop(index: int) -> dict[str, Any]:
    return {"index": index, "status": "ok"}


@app.task(name="bench.collect")
def collect(results: list[dict[str, Any]]) -> int:
    return len(results)


_lock = threading.Lock()
_client: anthropic.Anthropic | None = None


@app.task(name="bench.one_call")
def one_call(index: int, model: str, prompt: str) -> dict[str, Any]:
    global _client
    with _lock:
        if _client is None:
            _client = anthropic.Anthropic(base_url=os.environ["BENCH_SIM_URL"],
                                          api_key=os.environ["BENCH_API_KEY"], max_retries=0)
    reply = _client.messages.create(model=model, max_tokens=1024,
                                    messages=[{"role": "user", "content": prompt}])
    return {"index": index, "status": "ok", "output_tokens": reply.usage.output_tokens}
