"""``except drover.DroverError`` catches what drover raises for a user, from the real client
against the real Redis, and each error is still caught by its standard parent."""

from __future__ import annotations

import pytest

import drover
from drover import JobHandle, JobSpec, submit
from drover.config import load_settings


def test_an_unknown_job_is_a_drover_error_and_a_lookup_error(drover_env):
    with pytest.raises(drover.DroverError) as caught:
        JobHandle.attach("no-such-job")
    assert isinstance(caught.value, drover.JobNotFound)
    assert isinstance(caught.value, LookupError) and "no job 'no-such-job'" in str(caught.value)


def test_a_bad_setting_is_a_drover_error_and_a_value_error(monkeypatch):
    monkeypatch.setenv("DROVER_RPM", "-5")
    with pytest.raises(drover.DroverError) as caught:
        load_settings()
    assert isinstance(caught.value, drover.SettingsError) and isinstance(caught.value, ValueError)
    assert "DROVER_RPM" in str(caught.value)


def test_a_refused_job_is_a_drover_error_and_nothing_is_enqueued(drover_env):
    with pytest.raises(drover.DroverError) as caught:
        submit(JobSpec(subtasks=["Weigh cargo"], tools=["no_such_tool"]))
    assert isinstance(caught.value, drover.JobRefused) and isinstance(caught.value, ValueError)
    assert "no_such_tool" in str(caught.value)


def test_a_wait_that_runs_out_is_a_drover_error_and_a_timeout_error(drover_env):
    handle = submit(JobSpec(subtasks=["Weigh cargo"], max_tokens=20))  # no worker runs it
    try:
        with pytest.raises(drover.DroverError) as caught:
            handle.wait(timeout=0.3)
        assert isinstance(caught.value, drover.WaitTimeout)
        assert isinstance(caught.value, TimeoutError) and handle.id in str(caught.value)
    finally:
        handle.cancel()
