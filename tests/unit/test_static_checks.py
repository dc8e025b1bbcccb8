"""The static checks run with the tests (so in CI, from the README's one test command): ruff
over the repository, as pyproject configures it, and mypy over the package (``drover.*``, as
it installs; tests/ and bench/ are not checked: pyproject's [tool.mypy] says so).

The repository's root is the package ``drover`` (pyproject: ``package-dir = {"drover" =
"."}``), and mypy names modules after their folders: it runs as ``mypy -p drover`` from a
directory of this test's own, where a link named ``drover`` points at the checkout. That
directory and mypy's cache stay from run to run (keyed by the checkout's path), so a run
after the first re-reads only the files that changed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers import ROOT


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # No timeout of its own: mypy from a cold cache (a fresh clone) takes 20-26 CPU-s, and on
    # two cores at a load of 15 it took 271 s, near the 300 s this once allowed; pytest's
    # timeout (pyproject) is the guard against a hang.
    return subprocess.run([sys.executable, "-m", *argv], cwd=cwd, capture_output=True,
                          text=True)


def test_ruff_finds_nothing():
    done = _run(["ruff", "check", "--no-cache", "."], ROOT)
    assert done.returncode == 0, f"ruff check . found:\n{done.stdout}{done.stderr}"


def _mypy_home() -> Path:
    """A directory of this checkout's own with ``drover`` -> the checkout, and mypy's cache."""
    home = Path(tempfile.gettempdir()) / (
        "drover-mypy-" + hashlib.sha256(str(ROOT).encode()).hexdigest()[:12])
    home.mkdir(exist_ok=True)
    link = home / "drover"
    if not link.is_symlink() or link.resolve() != ROOT:
        tmp = home / f"drover.{os.getpid()}"
        tmp.symlink_to(ROOT, target_is_directory=True)
        tmp.replace(link)  # atomic: another test process may be doing the same
    return home


def test_mypy_finds_nothing_in_the_package():
    home = _mypy_home()
    done = _run(["mypy", "-p", "drover", "--config-file", str(ROOT / "pyproject.toml"),
                 "--cache-dir", str(home / "cache"), "--no-color-output",
                 "--no-error-summary"], home)
    assert done.returncode == 0, (
        f"mypy -p drover (run as `python -m pytest tests/unit/test_static_checks.py`) "
        f"found:\n{done.stdout}{done.stderr}")
