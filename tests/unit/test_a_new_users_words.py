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
