"""What a user asks for: a ``JobSpec`` (validated before anything is enqueued).

It lives in ``workers`` because workers read it back from Redis; users import it from
``orchestrator``.
"""

from __future__ import annotations

import difflib
import json
import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200_000)]
TenantName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
# Highest first: the level orders the jobs of one tenant (workers/fairshare/scheduler.py).
PRIORITIES = ("interactive", "normal", "batch")
Priority = Literal["interactive", "normal", "batch"]
DEFAULT_TENANT = "default"


class JobSpec(BaseModel):
    """One fan-out job: the sub-agents' tasks (or a goal to plan from) and how to run them.

    ``subtasks`` are plain strings, each one sub-agent's task. Give ``goal`` instead to have
    the model plan at most ``max_subtasks`` subtasks first. Or run a team's own code:
    ``subagent`` names an ``@subagent`` function and ``inputs`` gives one JSON value per
    sub-agent (``workers/tools/subagents.py``).
    """

    # hide_input: a bad value's error never repeats it (a subtask or a system prompt).
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    subtasks: list[Text] = Field(default_factory=list)
    goal: Text | None = None
    max_subtasks: int = Field(default=8, ge=1, le=1000)
    system: str | None = Field(default=None, max_length=400_000)
    model: str | None = Field(default=None, min_length=1, max_length=200)
    max_tokens: int = Field(default=1024, ge=1, le=128_000)
    # Extended thinking: a token budget for each sub-agent turn's thinking (the API's
    # ``thinking`` parameter); counted as output, within max_tokens. None: off.
    thinking: int | None = Field(default=None, ge=1024, le=128_000)
    tools: list[str] = Field(default_factory=list)
    mode: Literal["partial", "all_or_nothing"] = "partial"
    max_turns: int | None = Field(default=None, ge=1, le=200)
    token_budget: int | None = Field(default=None, ge=1)
    subagent_token_budget: int | None = Field(default=None, ge=1)
    # A cap in dollars (DROVER_PRICES): each call reserves its worst case before it is sent
    # and a call that would pass the cap is not sent (its sub-agent ends budget_exceeded).
    max_cost_usd: float | None = Field(default=None, gt=0)
    deadline_s: float | None = Field(default=None, gt=0)
    max_parallel_tools: int | None = Field(default=None, ge=1, le=256)
    synthesize: bool | str = False
    # realtime: messages.create through the limiter. batch: every turn of every sub-agent
    # goes through the Message Batches API (half the price, up to 24 h per turn). auto:
    # batch when the deadline allows it (none, or >= DROVER_BATCH_AUTO_MIN_DEADLINE_S).
    delivery: Literal["realtime", "batch", "auto"] = "realtime"
    metadata: dict[str, str] = Field(default_factory=dict)
    # Fair share (docs/fair-share.md): the tenant's weight and token
    # budget are settings; the priority orders the jobs of one tenant.
    tenant: TenantName = DEFAULT_TENANT
    priority: Priority = "normal"
    # A team's own sub-agent (an @subagent function) run once per input, instead of drover's
    # loop over subtasks; each input is any JSON value, stored with the job like a subtask.
    subagent: str | None = Field(default=None, min_length=1, max_length=200)
    inputs: list[Any] = Field(default_factory=list)

    @field_validator("inputs", mode="before")
    @classmethod
    def _inputs_are_json(cls, value: Any) -> Any:
        """Each input must survive JSON (it is stored as JSON and handed back from it); the
        error names the position and the type, never the value (it may be private)."""
        if not isinstance(value, list | tuple):
            raise ValueError(f"inputs must be a list of JSON values (one sub-agent each), not "
                             f"{type(value).__name__}")
        for position, item in enumerate(value):
            problem = json_problem(item)
            if problem is not None:
                raise ValueError(f"inputs[{position}] is not JSON ({problem}): give each "
                                 "input as a dict, list, string, number, boolean or None")
        return list(value)

    @model_validator(mode="wrap")
    @classmethod
    def _name_the_closest_field(cls, data: Any, handler: ValidatorFunctionWrapHandler
                                ) -> JobSpec:
        """An unknown field's error names the closest field (``max_token``: ``max_tokens``)."""
        try:
            return handler(data)
        except ValidationError as error:
            if not any(e["type"] == "extra_forbidden" for e in error.errors()):
                raise
            raise ValidationError.from_exception_data(
                error.title, [_with_suggestion(e) for e in error.errors()],
                hide_input=True) from None

    @model_validator(mode="after")
    def _one_source_of_work(self) -> JobSpec:
        # An empty inputs list is the default, not a request: a spec dumped whole (drover
        # submit's JSON, model_dump_json) names every field.
        if self.subagent is not None or self.inputs:
            return self._own_code()
        if self.subtasks and self.goal:
            raise ValueError("give either subtasks or a goal to plan from, not both")
        if not self.subtasks and not self.goal:
            if "subtasks" in self.model_fields_set:
                raise ValueError("subtasks is an empty list: give at least one subtask (a "
                                 "string, one sub-agent's task), or a goal to plan from")
            raise ValueError("a job needs subtasks (a list of strings) or a goal to plan from")
        if self.thinking is not None and self.thinking >= self.max_tokens:
            raise ValueError(f"thinking ({self.thinking}) must be below max_tokens "
                             f"({self.max_tokens}): the thinking budget is part of the answer's "
                             "max_tokens, as the API requires")
        return self

    def _own_code(self) -> JobSpec:
        """A job of a team's own ``@subagent``: its inputs, and none of the fields that only
        drover's own loop reads (said, so nobody believes they took effect)."""
        if self.subagent is None:
            raise ValueError("inputs are for a job of your own sub-agent: name its @subagent "
                             "function with subagent='name' (or give subtasks, not inputs)")
        if self.subtasks or self.goal:
            raise ValueError(f"subagent={self.subagent!r} runs your function once per input: "
                             "give inputs=[...], and no subtasks or goal (those are for "
                             "drover's own loop)")
        if not self.inputs:
            raise ValueError(f"subagent={self.subagent!r} needs inputs: a non-empty list of "
                             "JSON values, one sub-agent each")
        # A value at its default is no request (a spec dumped whole names every field).
        loop_only = [name for name in LOOP_ONLY if getattr(self, name) != type(self)
                     .model_fields[name].get_default(call_default_factory=True)]
        if loop_only:
            raise ValueError(f"{', '.join(loop_only)}: only drover's own loop reads "
                             f"{'it' if len(loop_only) == 1 else 'them'}; your @subagent "
                             f"function {self.subagent!r} makes its own calls (its model, "
                             "max_tokens and prompts are in its code): leave "
                             f"{'it' if len(loop_only) == 1 else 'them'} out")
        return self


# What a job of a team's own @subagent refuses: drover's loop alone reads these (the
# function passes its own model, max_tokens and system prompt to the client, and sends its
# calls itself, never in a Message Batch), or planning and the join do. The budgets
# (max_turns: its calls; subagent_token_budget, token_budget) hold for it as for the loop.
LOOP_ONLY = ("system", "model", "max_tokens", "thinking", "tools", "max_parallel_tools",
             "synthesize", "delivery", "max_subtasks")


def json_problem(value: Any, depth: int = 0) -> str | None:
    """Why ``value`` is not plain JSON (its type, never its content), or None."""
    if depth > 100:
        return "nested deeper than 100 levels"
    if value is None or isinstance(value, bool | int | str):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"the float {value}"
    if isinstance(value, list | tuple):
        return next((p for v in value if (p := json_problem(v, depth + 1))), None)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return "a dict with a key that is not a string"
        return next((p for v in value.values() if (p := json_problem(v, depth + 1))), None)
    return f"a {type(value).__name__}"


def output_json(value: Any) -> str:
    """``value`` as JSON text; ValueError naming what is not JSON."""
    problem = json_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return json.dumps(value, allow_nan=False)


# Models known to have no extended thinking (the Claude 3 and 3.5 families; 3.7 Sonnet and
# the Claude 4 models have it), by the prefix of their names: the API would answer each call
# 400, so a job asking for thinking on one is refused at submit instead.
NO_THINKING_MODELS = ("claude-3-haiku", "claude-3-sonnet", "claude-3-opus",
                      "claude-3-5-haiku", "claude-3-5-sonnet")


def thinking_refused(model: str, thinking: int | None) -> str | None:
    """Why ``thinking`` cannot be asked of ``model`` (None: nothing known against it)."""
    if thinking is None or not model.startswith(NO_THINKING_MODELS):
        return None
    return (f"thinking ({thinking}) was asked of the model {model!r}, which has no extended "
            "thinking (the Claude 3 and 3.5 models): choose a model that has it (e.g. "
            "claude-sonnet-4-5, claude-3-7-sonnet) or leave thinking unset")


def unknown_field_message(name: str) -> str:
    """What to say about a field JobSpec does not have: the closest one, or all of them."""
    fields = list(JobSpec.model_fields)
    close = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
    return "not a JobSpec field" + (f"; did you mean {close[0]!r}?" if close else
                                    f" (fields: {', '.join(fields)})")


def _with_suggestion(error: Any) -> InitErrorDetails:
    details: dict[str, Any] = {"loc": error["loc"], "input": error["input"]}
    if error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
        details["type"] = PydanticCustomError(
            "extra_forbidden", unknown_field_message(str(error["loc"][0])))
    else:
        details["type"] = error["type"]
        if "ctx" in error:
            details["ctx"] = error["ctx"]
    return details  # type: ignore[return-value]
