"""The Celery app's public path: ``celery -A drover.workers.app worker`` (and ``drover worker``,
Flower, the Dockerfile, docker-compose and users' own deployments name it). The app itself is
built in ``drover.workers.tasklayer.app``; this module only keeps the path every command line
uses."""

from drover.workers.tasklayer.app import DroverCelery, app

__all__ = ["DroverCelery", "app"]
