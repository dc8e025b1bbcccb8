"""The fleet as its operators see it: ``drover stats`` (``stats.py``), the jobs and tenants of
the fair-share window (``shares.py``), the Prometheus exporter (``metrics.py``), Flower behind a
password (``flower.py``), and first contact with (or local copies of) the services drover
needs: Redis, the broker, a Sentinel set for tests (``services.py``, ``sentinels.py``)."""

__all__: list[str] = []
