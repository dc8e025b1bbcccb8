"""The Celery app: ``celery -A workers.app worker`` (or ``drover worker``)."""

from __future__ import annotations

from celery import Celery

from config import get_settings
from config.celery import celery_config
from workers.logs import configure_logging

app = Celery("drover", include=["workers.tasks"])
app.config_from_object(celery_config(get_settings()))
configure_logging()  # one line per LLM call; no task results (model text) in the log
