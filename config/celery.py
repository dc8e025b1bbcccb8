"""The Celery configuration, built from drover's settings.

JSON only (task messages are readable in Flower and never unpickled), late acks with a
prefetch of one (a killed worker's task goes back to the queue instead of being lost), and a
broker ``visibility_timeout`` that Settings has already checked against the longest countdown
and the longest task run, so a retry waiting in a worker's memory is never delivered twice.
"""

from __future__ import annotations

from typing import Any

from config.settings import Settings


def restore_interval_s(settings: Settings) -> int:
    """How often a worker looks for unacked tasks older than the visibility timeout.

    Kombu's own default sweeps every 10 s but scans only on every 10th sweep (100 s); drover
    scans on every sweep, at most every 10 s and at least 10 times per visibility timeout, so
    a killed worker's tasks come back within ``visibility_timeout_s`` plus this.
    """
    return max(1, min(10, settings.visibility_timeout_s // 10))


def celery_config(settings: Settings) -> dict[str, Any]:
    transport = {
        "visibility_timeout": settings.visibility_timeout_s,
        "unacked_restore_interval": restore_interval_s(settings),
        "unacked_restore_throttle": 1,
        # A key prefix of our own keeps tests and several deployments apart on one Redis.
        "global_keyprefix": f"{settings.key_prefix}:celery:",
        "socket_connect_timeout": 5,
        "retry_on_timeout": True,
        "health_check_interval": 10,
    }
    return {
        "broker_url": settings.broker,
        "result_backend": settings.backend,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_default_queue": settings.queue,
        "task_time_limit": settings.task_time_limit_s,
        "task_soft_time_limit": settings.task_time_limit_s - 5,
        "result_expires": settings.result_ttl_s,
        "result_extended": False,
        "task_track_started": True,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "broker_transport_options": transport,
        "result_backend_transport_options": {"global_keyprefix": f"{settings.key_prefix}:celery:"},
        # Sending a task (a retry, the chord's join) rides out a broker restart of up to about a
        # minute, like drover's own Redis clients; Celery's default gives up after ~1 s.
        "task_publish_retry_policy": {"max_retries": 40, "interval_start": 0,
                                      "interval_step": 0.5, "interval_max": 2},
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "redis_backend_health_check_interval": 10,
        "redis_retry_on_timeout": True,
        "redis_socket_keepalive": True,
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "worker_hijack_root_logger": False,
    }
