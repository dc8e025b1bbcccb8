"""The tools sub-agents call: the registry and the ``@tool`` decorator, and one turn's run of
the model's ``tool_use`` blocks (``_tools.py`` says how); ``demo.py`` holds the offline tools
of ``drover demo`` and the tests (``DROVER_TOOL_MODULES``' default). A team's own sub-agents
(``@subagent``, ``subagents.py``) register from the same modules.

Users import ``tool`` from ``drover``; the agent asks ``get_tools`` and ``run_turn``. Builds on
telemetry only: it knows neither the agent nor Celery.
"""

from drover.workers.tools._tools import (
    REGISTRY,
    RESULT_CHARS,
    Tool,
    ToolKind,
    cut_result,
    get_tools,
    run_turn,
    tool,
)
from drover.workers.tools.subagents import (
    LOOP,
    SUBAGENTS,
    Subagent,
    builtin,
    get_subagent,
    reserved,
    subagent,
)

__all__ = ["LOOP", "REGISTRY", "RESULT_CHARS", "SUBAGENTS", "Subagent", "Tool", "ToolKind",
           "builtin", "cut_result", "get_subagent", "get_tools", "reserved", "run_turn",
           "subagent", "tool"]
