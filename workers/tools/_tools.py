"""Tools the sub-agents may call: a registry, the ``@tool`` decorator, and one turn's execution.

Register a function and name it in ``JobSpec.tools``::

    from drover import tool

    @tool(kind="read", timeout_s=10, rps=5)
    def get_quote(symbol: str) -> str:
        "Latest price of a stock symbol."
        ...

The input schema comes from the type hints (through pydantic), or is the model's own when
the function takes a single pydantic model (it is then called with that model); the
description comes from the docstring. The model's input is validated against that schema
before the call, so a bad input is an error result that says which field is wrong, not an
exception inside the tool. Workers import the modules named in ``DROVER_TOOL_MODULES`` at
start-up, so every host knows the same tools.

One turn's ``tool_use`` blocks run together: read tools concurrently under a bound, write
tools one after another in the model's order (a write may depend on the one before it). Every
call has a timeout; a sync function runs in a thread, and a thread cannot be killed, so a
hung sync tool is abandoned (its slot freed, the model told) rather than waited for. Every
``tool_use`` gets exactly one ``tool_result``, in the model's order: failures, timeouts and
calls over the per-turn cap become ``is_error`` results that say why.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, overload

from pydantic import BaseModel, ValidationError, create_model

from drover.errors import JobRefused
from drover.workers.telemetry import tool_call

ToolKind = Literal["read", "write"]
RESULT_CHARS = 20_000  # DROVER_MAX_TOOL_RESULT_CHARS's default
log = logging.getLogger(__name__)
_CUT_LOGGED: set[str] = set()  # tools whose cut result this process has logged already

# Sync tools run in a pool of their own: a hung tool that was abandoned at its timeout keeps
# its thread, and must not starve the loop's default executor (the job store's Redis calls).
_TOOL_THREADS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="drover-tool")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    fn: Callable[..., Any]
    kind: ToolKind = "read"
    timeout_s: float | None = None
    rps: float | None = None
    takes_idempotency_key: bool = field(default=False)
    # Validates the model's input: the function's own pydantic parameter type, or a model
    # built from its type hints.
    input_model: type[BaseModel] | None = field(default=None, compare=False)
    # Name of the single pydantic parameter, when the function takes one (it gets the model).
    model_param: str | None = None

    def arguments(self, tool_input: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments for ``fn`` from the model's input; ValidationError if it is bad."""
        if self.input_model is None:
            return dict(tool_input)
        value = self.input_model.model_validate(tool_input)
        if self.model_param is not None:
            return {self.model_param: value}
        return {name: getattr(value, name) for name in type(value).model_fields}

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "input_schema": self.input_schema}


REGISTRY: dict[str, Tool] = {}


def _input_model(fn: Callable[..., Any]) -> tuple[type[BaseModel], str | None]:
    """The pydantic model of a tool's input, and the parameter that takes it whole (if any)."""
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.name != "idempotency_key"]
    try:
        hints = inspect.get_annotations(fn, eval_str=True)
    except NameError as error:
        raise ValueError(f"tool {fn.__name__!r}: cannot resolve its type hints ({error}); "
                         "define the types it uses at module level") from None
    if len(params) == 1 and isinstance(hints.get(params[0].name), type) and issubclass(
            hints[params[0].name], BaseModel):
        return hints[params[0].name], params[0].name
    fields = {p.name: (hints.get(p.name, Any),
                       ... if p.default is inspect.Parameter.empty else p.default)
              for p in params}
    return create_model(f"{fn.__name__}_input", **fields), None  # type: ignore[call-overload]


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


F = TypeVar("F", bound=Callable[..., Any])


@overload
def tool(name: F, /) -> F: ...
@overload
def tool(name: str | None = None, *, description: str | None = None, kind: ToolKind = "read",
         timeout_s: float | None = None, rps: float | None = None) -> Callable[[F], F]: ...


def tool(name: Any = None, *, description: str | None = None, kind: ToolKind = "read",
         timeout_s: float | None = None, rps: float | None = None) -> Any:
    """Register a function as a tool: ``@tool`` bare, or ``@tool("name", kind=..., ...)``.

    ``rps`` puts it under a global limiter scope of its own.
    """
    if callable(name):  # used bare: @tool
        return tool()(name)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"@tool's name must be a string, not {type(name).__name__}")
    if kind not in ("read", "write"):
        raise ValueError(f"tool kind must be 'read' or 'write', not {kind!r}")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        tool_name = name or fn.__name__
        text = description or inspect.getdoc(fn)
        if not text:
            raise ValueError(f"tool {tool_name!r} needs a description (or a docstring)")
        model, model_param = _input_model(fn)
        REGISTRY[tool_name] = Tool(
            name=tool_name, description=text, input_schema=_schema(model), fn=fn, kind=kind,
            timeout_s=timeout_s, rps=rps,
            takes_idempotency_key="idempotency_key" in inspect.signature(fn).parameters,
            input_model=model, model_param=model_param)
        return fn

    return register


def get_tools(names: list[str]) -> list[Tool]:
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        import difflib

        known = ", ".join(sorted(REGISTRY)) or "none"
        close = [f"{n} (did you mean {match[0]}?)" if (match := difflib.get_close_matches(
            n, list(REGISTRY), n=1)) else n for n in unknown]
        raise JobRefused(f"unknown tool(s) {', '.join(close)}; registered tools: {known}. "
                         "A tool is a function decorated with @tool (`from drover import "
                         "tool`) in a module named in DROVER_TOOL_MODULES")
    return [REGISTRY[n] for n in names]


# --- one turn -----------------------------------------------------------------------------

Gate = Callable[[Tool], Awaitable[None]]  # waits for a tool's own rate-limit scope, if any
Save = Callable[[str, dict[str, Any]], Awaitable[None]]


def _result(tool_use_id: str, content: str, is_error: bool = False) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": content,
            "is_error": is_error}


def cut_result(result: dict[str, Any], max_chars: int, tool_name: str) -> dict[str, Any]:
    """``result`` with its content cut to ``max_chars`` characters, ending in a marker that
    tells the model how much it did not get (so it can ask for less); itself if it fits.

    The result goes into the checkpoint and every later request of the sub-agent, so an
    unbounded one would grow both without end. The log says so once per tool and process.
    """
    content = result["content"]
    if not isinstance(content, str) or len(content) <= max_chars:
        return result
    marker = (f"\n[drover: tool result cut to {max_chars:,} of {len(content):,} characters "
              "(DROVER_MAX_TOOL_RESULT_CHARS); ask for a smaller part if you need the rest]")
    kept = content[:max(0, max_chars - len(marker))] + marker
    if tool_name not in _CUT_LOGGED:
        _CUT_LOGGED.add(tool_name)
        log.warning("tool %s returned %d characters; cut to %d (DROVER_MAX_TOOL_RESULT_CHARS); "
                    "later cuts of this tool are not logged", tool_name, len(content), max_chars)
    return {**result, "content": kept}


@tool_call
async def _invoke(tool_: Tool, call: dict[str, Any], default_timeout: float) -> dict[str, Any]:
    try:
        kwargs = tool_.arguments(call.get("input") or {})
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'input'}: {e['msg']}"
                             for e in error.errors())
        return _result(call["id"], f"tool {tool_.name} got bad input: {problems}", True)
    if tool_.takes_idempotency_key:
        # A write tool that is retried after a crash gets the same key: the tool_use id.
        kwargs["idempotency_key"] = call["id"]
    timeout = tool_.timeout_s or default_timeout
    try:
        if inspect.iscoroutinefunction(tool_.fn):
            value = await asyncio.wait_for(tool_.fn(**kwargs), timeout)
        else:
            loop = asyncio.get_running_loop()
            work = loop.run_in_executor(_TOOL_THREADS, lambda: tool_.fn(**kwargs))
            value = await asyncio.wait_for(work, timeout)
    except TimeoutError:
        return _result(call["id"], f"tool {tool_.name} timed out after {timeout:g} s", True)
    except TypeError as error:
        return _result(call["id"], f"tool {tool_.name} got bad input: {error}", True)
    except Exception as error:  # a tool's failure is the model's to see, not the worker's
        kind = type(error).__name__
        return _result(call["id"], f"tool {tool_.name} raised {kind}: {error}", True)
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return _result(call["id"], text)


async def run_turn(calls: list[dict[str, Any]], allowed: dict[str, Tool], *,
                   done: dict[str, dict[str, Any]], max_parallel: int, max_calls: int,
                   default_timeout: float, save: Save, gate: Gate | None = None,
                   probe: Callable[[int], None] | None = None,
                   max_result_chars: int = RESULT_CHARS) -> list[dict[str, Any]]:
    """Run one assistant message's tool calls; one result per call, in the model's order.

    ``done`` holds results saved before a crash or retry (by tool_use id): those calls are not
    run again. ``save`` stores each result as it completes, cut to ``max_result_chars``.
    ``probe`` (for tests) is told how many calls run at once.
    """
    slots = asyncio.Semaphore(max_parallel)
    results: dict[str, dict[str, Any]] = {}
    running = 0

    async def one(call: dict[str, Any]) -> None:
        nonlocal running
        tool_ = allowed.get(call["name"])
        if tool_ is None:
            names = ", ".join(sorted(allowed)) or "none"
            result = _result(call["id"], f"unknown tool {call['name']!r}; available: {names}", True)
        else:
            if gate is not None:
                await gate(tool_)
            async with slots:
                running += 1
                if probe:
                    probe(running)
                try:
                    result = await _invoke(tool_, call, default_timeout)
                finally:
                    running -= 1
        result = cut_result(result, max_result_chars, call["name"])
        results[call["id"]] = result
        await save(call["id"], result)

    async def writes_in_order(write_calls: list[dict[str, Any]]) -> None:
        for call in write_calls:
            await one(call)

    todo: list[dict[str, Any]] = []
    for position, call in enumerate(calls):
        if call["id"] in done:
            results[call["id"]] = done[call["id"]]
        elif position >= max_calls:
            results[call["id"]] = _result(
                call["id"], f"not run: more than {max_calls} tool calls in one turn; "
                "ask for the rest in a later turn", True)
        else:
            todo.append(call)
    writes = [c for c in todo if c["name"] in allowed and allowed[c["name"]].kind == "write"]
    reads = [c for c in todo if c not in writes]
    try:
        async with asyncio.TaskGroup() as group:
            for call in reads:
                group.create_task(one(call))
            if writes:
                group.create_task(writes_in_order(writes))
    except ExceptionGroup as failed:
        # A save that failed (Redis away, a claim superseded) ends the turn as itself: the
        # sub-agent retries or stops on it by type, which a group would hide (it crashed).
        raise failed.exceptions[0] from None
    return [results[call["id"]] for call in calls]
