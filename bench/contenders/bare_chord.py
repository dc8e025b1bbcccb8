"""The baseline of `bench/overhead.py`: a bare Celery chord of no-op tasks.

Its app has drover's own Celery configuration (`config.celery.celery_config`: JSON, late
acks, prefetch 1, Redis broker and result backend, drover's key prefix), so the difference
to a drover job is drover's work, not Celery settings. Workers run
`celery -A bench.contenders.bare_chord worker`; the harness sends by task name.
"""

from __future__ import annotations

from typing import Any

from celery import Celery


def make_app() -> Celery:
    from config import get_settings
    from config.celery import celery_config

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
