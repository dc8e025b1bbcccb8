"""What a new user met, each a wrong word at the wrong time (issue 52, item 7): the name of a
JobResult's records, and the fields ``drover submit --help`` lists."""

from __future__ import annotations

import contextlib
import io

import pytest


def test_a_job_results_records_are_its_results_under_the_docs_name():
    from drover.workers.jobs.records import JobResult, SubagentResult, Usage

    records = [SubagentResult(job_id="j", index=i, status="ok") for i in range(2)]
    result = JobResult(job_id="j", status="done", results=records, counts={"ok": 2},
                       usage=Usage(), wall_s=1.0)
    assert result.records == result.results == records
    assert "records" not in result.model_dump()  # stored and printed as "results", as before


def test_submit_help_lists_every_field_a_job_spec_takes():
    from drover.orchestrator.cli import main
    from drover.workers.jobs.spec import JobSpec

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["submit", "--help"])
    text = " ".join(out.getvalue().split())
    for name in JobSpec.model_fields:
        assert f"{name}" in text, name
    for shown in ("thinking", "delivery (realtime | batch | auto)", "tenant",
                  "priority (interactive | normal | batch)"):
        assert shown in text, shown


def test_the_jobs_walkthrough_gives_the_workers_the_simulators_limits():
    """docs/jobs.md's walk-through ran the simulator without limits and the workers at their
    defaults (50 RPM): 60 calls took 83 s and the page never said why."""
    import re

    from tests.helpers import ROOT

    page = (ROOT / "docs" / "jobs.md").read_text()
    shell = page[page.index("## Write your own tools and jobs"):]
    shell = shell[shell.index("```sh"):]
    shell = shell[:shell.index("```", 5)]
    sim = next(line for line in shell.splitlines() if line.startswith("drover sim"))
    for dim in ("rpm", "itpm", "otpm"):
        given = re.search(rf"--{dim} (\d+)", sim)
        told = re.search(rf"DROVER_{dim.upper()}=(\d+)", shell)
        assert given and told and given.group(1) == told.group(1), (dim, shell)
    assert "1.2 s" in page  # and it says what the defaults would cost


def test_the_usage_lines_read_tokens_unanswered_batch_then_cost():
    """What `drover result` and `drover watch` print under the table, in the order a reader
    takes it: the answered calls' tokens, the calls never answered, the batch part, and last
    what it all cost (tests/system/test_unanswered.py reads the unanswered line second)."""
    from drover.orchestrator.cli.watch import usage_lines
    from drover.workers.jobs.records import Usage

    usage = Usage(calls=32, input_tokens=1200, output_tokens=900, unanswered_calls=21,
                  unanswered_input_tokens=300, unanswered_output_tokens=25, batch_calls=4,
                  cost_usd=0.0294)
    lines = usage_lines(usage)
    assert [line.split(" ", 1)[0] for line in lines] == ["usage:", "unanswered:", "by", "cost:"]
    assert lines[1].startswith("unanswered: 21 calls sent") and lines[-1].startswith("cost: $")
