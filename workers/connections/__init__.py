"""Connections: every Redis client drover makes (a plain URL or a Sentinel list, sync and
asyncio, ``redis_clients``), the Celery broker's Sentinel transport (``sentinel_transport``,
named by ``drover.config.celery``), one worker's word on Redis being away (``redis_outage``)
and first contact with Redis and the broker before a process starts working (``preflight``).

Builds on ``drover.config`` only; every other room asks it for its clients. The modules are
imported by name, not from here: the CLI's quick refusals import ``preflight`` alone, and
``sentinel_transport`` pulls in kombu.
"""

__all__ = ["preflight", "redis_clients", "redis_outage", "sentinel_transport"]
