"""The client side, in three rooms: the Python API (``client/``: ``submit``, ``JobHandle``,
``plan``), the ``drover`` CLI (``cli/``) and the operators' views and servers (``ops/``:
stats, shares, the metrics exporter, Flower, local services). ``cli`` builds on the other two;
``client`` and ``ops`` only on ``drover.workers``. Users import the API from ``drover``."""

__all__: list[str] = []
