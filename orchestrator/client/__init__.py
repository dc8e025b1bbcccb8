"""The client API a user's program calls: ``submit(spec) -> JobHandle`` (``jobs.py``) and
``plan(goal)`` (``planning.py``). Users import it from ``drover`` itself.

``plan`` is imported on first use (PEP 562): it runs the agent (the provider SDKs), which
``drover stats`` and the CLI's quick refusals must not pay for when they import the client's
light parts (``workers.py``)."""

from typing import Any

from drover.orchestrator.client.jobs import (
    JobHandle,
    JobNotFound,
    Unreachable,
    check_spec,
    spec_bytes,
    submit,
)

__all__ = ["JobHandle", "JobNotFound", "Unreachable", "check_spec", "plan", "spec_bytes",
           "submit"]


def __getattr__(name: str) -> Any:
    if name == "plan":
        from drover.orchestrator.client.planning import plan

        return plan
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
