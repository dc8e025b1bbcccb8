"""The client side: the Python API (``drover.orchestrator.jobs``), planning, the ``drover`` CLI
and the ops servers (metrics, Flower). Users import the API from ``drover`` itself."""

__all__: list[str] = []
