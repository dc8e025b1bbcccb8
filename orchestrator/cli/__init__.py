"""The ``drover`` command line (``commands.py``: the parsers and every command), its
generated reference page (``reference.py``), ``drover demo`` and ``drover watch``. It renders
what the client API (``orchestrator/client``) and the ops views (``orchestrator/ops``) give it.
"""

from drover.orchestrator.cli.commands import main
from drover.orchestrator.client.workers import NO_WORKER_HINT_AFTER_S

__all__ = ["NO_WORKER_HINT_AFTER_S", "main"]
