"""A PostgreSQL database of the test's own for the results store (DROVER_RESULTS_URL): made
as ``drover_test_<random>`` on the server that ``.ci/run`` starts, dropped at the end. No other
database is touched. Skips, saying why, where psycopg or the server is missing."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

__all__ = ["ADMIN_URL", "own_database"]

# The server's maintenance database, where CREATE/DROP DATABASE run (trust auth on CI).
ADMIN_URL = os.environ.get("TEST_POSTGRES_URL",
                           "postgresql://postgres@127.0.0.1:5432/postgres")


@contextmanager
def own_database() -> Iterator[str]:
    """The URL of a new, empty database, dropped afterwards."""
    try:
        import psycopg
    except ImportError:
        pytest.skip("psycopg is not installed (pip install -e '.[test]' installs it)")
    try:
        admin = psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as error:
        pytest.skip(f"PostgreSQL does not answer at {ADMIN_URL.rpartition('@')[2]} "
                    f"(.ci/run starts it): {str(error).strip().splitlines()[0]}")
    name = f"drover_test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield ADMIN_URL.rpartition("/")[0] + "/" + name
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
