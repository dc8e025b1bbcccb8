"""A team's own sub-agents: the ``@subagent`` decorator and its registry.

A sub-agent of the team's own is an ``async def`` that takes one input and the limited client
and returns something JSON::

    import drover

    @drover.subagent
    async def research(item, llm):
        plan = await llm.messages.create(model=..., max_tokens=300, messages=[...])
        ...
        return {"topic": item, "verdict": verdict}

``JobSpec(subagent="research", inputs=[...])`` runs one per input on the workers, each as a
sub-agent of drover's own would run (fair share, cancel, deadlines, recovery, the join). The
modules named in ``DROVER_TOOL_MODULES`` are imported by every worker at start and by
``submit`` before it accepts a job, as for ``@tool``, so both know the same names.

A function that cannot be run as one (a plain ``def``, the wrong parameters) is registered
with what is wrong with it, not refused at import: a worker must not fail to start for one
team's mistake, and ``submit`` refuses the jobs that name it with that sentence.

drover's own agent loop is one sub-agent among these, registered as ``LOOP``
("drover.agent", by ``workers/agent/loop.py``) in a registry of its own: the names under
"drover." are drover's (a team's ``@subagent("drover....")`` is refused), and the listing and
did-you-mean of an unknown name show the team's functions only.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from drover.errors import JobRefused

__all__ = ["BUILTIN", "LOOP", "SUBAGENTS", "Subagent", "builtin", "get_subagent", "reserved",
           "subagent"]

LOOP = "drover.agent"  # drover's own agent loop, as the sub-agent a job of subtasks runs
RESERVED = "drover."  # the names of drover's own sub-agents begin so


@dataclass(frozen=True)
class Subagent:
    name: str
    fn: Callable[..., Any]
    problem: str | None = None  # why it cannot run as a sub-agent (None: it can)
    # drover's own (its loop): it stops at its own points on a cancel (it keeps an answer it
    # paid for), and what it raises is its run's to map, not a team function's failure.
    builtin: bool = False


SUBAGENTS: dict[str, Subagent] = {}  # the team's, from DROVER_TOOL_MODULES
BUILTIN: dict[str, Subagent] = {}  # drover's own, registered by the agent that runs them
F = TypeVar("F", bound=Callable[..., Any])


def _problem(name: str, fn: Callable[..., Any]) -> str | None:
    """What keeps ``fn`` from running as ``await fn(item, llm)``, in a sentence that says
    what to write instead."""
    want = f"`async def {name}(item, llm)`"
    if not inspect.iscoroutinefunction(fn):
        kind = "an async generator" if inspect.isasyncgenfunction(fn) else "not `async def`"
        return f"the @subagent function {name!r} is {kind}: write it as {want}"
    signature = inspect.signature(fn)
    try:
        signature.bind(None, None)
    except TypeError:
        takes = ", ".join(str(p).split(":")[0] for p in signature.parameters.values())
        return (f"the @subagent function {name!r} takes ({takes}), not (item, llm): write "
                f"it as {want}")
    return None


@overload
def subagent(name: F, /) -> F: ...
@overload
def subagent(name: str | None = None) -> Callable[[F], F]: ...


def subagent(name: Any = None) -> Any:
    """Register a team's own sub-agent: ``@subagent`` bare, or ``@subagent("name")``."""
    if callable(name):  # used bare: @subagent
        return subagent()(name)
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"@subagent's name must be a non-empty string, not {name!r}")

    if name is not None and reserved(name):
        raise ValueError(f"@subagent({name!r}): names beginning with {RESERVED!r} are "
                         "drover's own sub-agents; choose another name")

    def register(fn: F) -> F:
        own = name or fn.__name__
        SUBAGENTS[own] = Subagent(own, fn, _problem(own, fn))
        return fn

    return register


def reserved(name: str) -> bool:
    """Whether ``name`` is one of drover's own sub-agents' (no team's function takes it)."""
    return name.startswith(RESERVED)


def builtin(name: str, fn: Callable[..., Any]) -> None:
    """Register drover's own sub-agent ``name`` (a reserved name): ``fn(run, llm)``, handed
    its run's context instead of a JSON input."""
    if not reserved(name):
        raise ValueError(f"drover's own sub-agent {name!r} must be named {RESERVED}...")
    BUILTIN[name] = Subagent(name, fn, builtin=True)


def get_subagent(name: str) -> Subagent:
    """The registered sub-agent ``name`` (a team's, or drover's own); ``JobRefused`` saying
    what to fix when there is none of that name, or it cannot run as one."""
    found = BUILTIN.get(name) if reserved(name) else SUBAGENTS.get(name)
    if found is None:
        close = difflib.get_close_matches(name, list(SUBAGENTS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        known = ", ".join(sorted(SUBAGENTS)) or "none"
        raise JobRefused(f"unknown sub-agent {name!r}{hint}; registered sub-agents: {known}. "
                         "A sub-agent is an `async def name(item, llm)` decorated with "
                         "@drover.subagent in a module named in DROVER_TOOL_MODULES (set it "
                         "where you submit as on the workers)")
    if found.problem is not None:
        raise JobRefused(found.problem)
    return found
