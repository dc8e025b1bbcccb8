"""drover's own agent loop is one sub-agent among the team's: registered under a reserved name
("drover.agent"), which no team's ``@subagent`` can take nor a job name, hidden from the
listing and did-you-mean of an unknown name, and a job of subtasks runs it through the same
path (``SubagentRun._subagent`` -> ``own.run_own``) as a job of a team's function."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from drover import JobRefused, JobSpec
from drover.config.settings import Settings
from drover.orchestrator.client.jobs import check_subagent
from drover.workers.agent import subagent as subagent_module
from drover.workers.agent.llm import CallContext
from drover.workers.agent.loop import LOOP, LoopRun, agent_loop
from drover.workers.agent.subagent import SubagentRun
from drover.workers.jobs.records import Checkpoint
from drover.workers.tools import SUBAGENTS, get_subagent, subagent


def test_the_loop_is_registered_as_a_built_in_sub_agent():
    assert LOOP == "drover.agent"
    loop = get_subagent(LOOP)
    assert loop.builtin and loop.fn is agent_loop and loop.problem is None
    assert LOOP not in SUBAGENTS  # the team's registry holds the team's functions only


@pytest.mark.parametrize("name", ["drover.agent", "drover.mine"])
def test_a_teams_subagent_cannot_take_a_reserved_name(name):
    async def research(item: Any, llm: Any) -> Any:
        return item

    with pytest.raises(ValueError, match="drover's own sub-agents; choose another name"):
        subagent(name)(research)
    assert get_subagent(LOOP).fn is agent_loop


def test_an_unknown_name_lists_and_suggests_the_teams_functions_only():
    with pytest.raises(JobRefused) as refused:
        get_subagent("drover.agnet")
    message = str(refused.value)
    assert "did you mean" not in message and "drover.agent" not in message.split(";")[1]
    with pytest.raises(JobRefused) as refused:
        get_subagent("agent")
    assert "drover.agent" not in str(refused.value).split("'agent'", 1)[1]


def test_a_job_naming_the_loop_as_its_subagent_is_refused_at_submit():
    with pytest.raises(JobRefused, match="is drover's own agent loop: give it subtasks="):
        check_subagent(JobSpec(subagent=LOOP, inputs=[1]), Settings())


class _Ran(Exception):
    """What run_own was handed (the test stops the run there)."""


def _run_of(spec: JobSpec, task: str, monkeypatch: pytest.MonkeyPatch
            ) -> tuple[SubagentRun, dict[str, Any], CallContext]:
    """A run of ``spec``'s sub-agent on fakes, whose ``run_own`` records what it is handed."""
    turns: list[tuple[Any, ...]] = []
    rt = SimpleNamespace(
        settings=SimpleNamespace(model="claude-sim"),
        parts=SimpleNamespace(turn_client=lambda *a: turns.append(a) or "the turn client"),
        shared=SimpleNamespace(heartbeat=lambda: SimpleNamespace(draining=False)),
        store=None)
    seen: dict[str, Any] = {"turns": turns}

    async def run_own(own: Any, item: Any, llm: Any, ctx: CallContext) -> Any:
        seen.update(own=own, item=item, llm=llm, ctx=ctx)
        raise _Ran()

    monkeypatch.setattr(subagent_module, "run_own", run_own)
    run = SubagentRun(rt, "job", 3, own_client=lambda rt, ctx: "the journaled client")  # type: ignore[arg-type]
    run.spec, run.task, run.token = spec, task, 7
    run.state = Checkpoint.first(task)
    ctx = CallContext("job", 3, asyncio.Event())
    return run, seen, ctx


def test_a_loop_job_runs_the_built_in_through_the_same_path_as_a_teams_function(monkeypatch):
    spec = JobSpec(subtasks=["Survey berth 1"], model="claude-sim")
    run, seen, ctx = _run_of(spec, "Survey berth 1", monkeypatch)
    with pytest.raises(_Ran):
        asyncio.run(run._subagent(spec, run.state, ctx))
    assert seen["own"] is get_subagent(LOOP)
    assert isinstance(seen["item"], LoopRun)
    assert (seen["item"].spec, seen["item"].state, seen["item"].ctx) == (spec, run.state, ctx)
    assert seen["item"].token == 7
    # Its client is the turn client (decides, no journal), and the journal's hooks are not set:
    # the loop counts each answer itself, once.
    assert seen["llm"] == "the turn client" and seen["turns"] == [(run.rt, ctx, "claude-sim")]
    assert ctx.answered is None and ctx.check is None


def test_a_job_of_a_teams_function_takes_the_same_path_with_its_journaled_client(monkeypatch):
    async def probe(item: Any, llm: Any) -> Any:
        return item

    subagent("unit_probe")(probe)
    try:
        spec = JobSpec(subagent="unit_probe", inputs=[{"n": 1}])
        run, seen, ctx = _run_of(spec, '{"n": 1}', monkeypatch)
        with pytest.raises(_Ran):
            asyncio.run(run._subagent(spec, run.state, ctx))
    finally:
        SUBAGENTS.pop("unit_probe", None)
    assert seen["own"].fn is probe and not seen["own"].builtin
    assert seen["item"] == {"n": 1} and seen["llm"] == "the journaled client"
    assert ctx.answered == run._answered and ctx.check == run._check_own
    assert seen["turns"] == []
