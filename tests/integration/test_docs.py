"""The documentation stays true.

- docs/settings.md is the page the Settings model generates, and every setting has a
  description; docs/cli.md is what the CLI's parsers print;
- every page in docs/ is linked from the README, which stays a front door (300 lines at most);
- every fenced shell and Python block of the README and docs/ says whether it runs
  (``<!-- runnable -->``, ``<!-- runnable: file NAME.py -->`` or
  ``<!-- not runnable: REASON -->`` on the line before it), and the runnable ones run, as
  written, against a real Redis, a real worker process and the simulator.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from drover.config import docs

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE = {"sh", "bash", "shell", "console", "python", "py"}
MARKER = re.compile(r"<!--\s*(runnable(?::\s*file\s+(?P<file>[\w.-]+))?"
                    r"|not runnable:\s*(?P<why>.+?))\s*-->")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)")


@dataclass
class Block:
    page: Path
    line: int            # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None   # the comment's text, or None when there is none
    file: str | None     # `runnable: file NAME`: write the block there
    runnable: bool

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, lang, start = match.group("indent"), match.group("lang").lower(), i
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1  # the closing fence
        if lang not in CODE:
            continue
        before = next((line for line in reversed(lines[:start]) if line.strip()), "")
        marker = MARKER.search(before)
        blocks.append(Block(
            page=page, line=start + 1, lang=lang, code="\n".join(body) + "\n",
            marker=marker.group(0) if marker else None,
            file=marker.group("file") if marker else None,
            runnable=bool(marker) and marker.group(1).startswith("runnable")))
    return blocks


ALL = [block for page in PAGES for block in _blocks(page)]


# --- settings ----------------------------------------------------------------------------------

def test_every_setting_has_a_description() -> None:
    missing = docs.missing_descriptions()
    assert not missing, (
        f"these settings have no description= in config/settings.py (docs/settings.md is "
        f"generated from it): {', '.join(missing)}; add one, then run `{docs.COMMAND}`")


def test_the_settings_page_is_what_the_settings_model_generates() -> None:
    page = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert page == docs.render(), (
        f"docs/settings.md is out of date with config/settings.py: run `{docs.COMMAND}` "
        "and commit the page")


def test_the_cli_page_is_what_the_parsers_print() -> None:
    from drover.orchestrator.cli import reference as cli_reference

    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert page == cli_reference.render(), (
        f"docs/cli.md is out of date with the CLI's parsers: run `{cli_reference.COMMAND}` "
        "and commit the page")


# --- the README and the pages ------------------------------------------------------------------

def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, (f"README.md has {lines} lines, over 300: move the details to a page "
                          "in docs/ and link it")


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)(?:#[\w-]*)?\)", readme))
    pages = {f"docs/{page.name}" for page in PAGES[1:]}
    assert pages <= linked, (f"pages in docs/ the README does not link: "
                             f"{', '.join(sorted(pages - linked))}; add each to its "
                             "Documentation list")


def test_every_link_between_pages_finds_its_page() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([\w./-]+\.md)(?:#[\w-]*)?\)", page.read_text("utf-8")):
            if not (page.parent / target).is_file():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, f"links to pages that do not exist: {', '.join(broken)}"


def test_every_test_file_the_pages_name_exists() -> None:
    missing = sorted({f"{page.relative_to(ROOT)} names {path}" for page in PAGES
                      for path in re.findall(r"tests/[\w/]+\.py", page.read_text("utf-8"))
                      if not (ROOT / path).is_file()})
    assert not missing, (f"the pages name test files that are not there (moved?): "
                         f"{'; '.join(missing)}")


def test_every_shell_and_python_block_says_whether_it_runs() -> None:
    unmarked = [block.where for block in ALL if block.marker is None]
    assert not unmarked, (
        "these fenced blocks have no marker on the line before them: "
        f"{', '.join(unmarked)}; add <!-- runnable --> (tests/test_docs.py runs it against "
        "the simulator), <!-- runnable: file NAME.py --> or <!-- not runnable: REASON -->")
    files = [block.file for block in ALL if block.file]
    assert len(files) == len(set(files)), f"two blocks write the same file: {sorted(files)}"


# --- the runnable blocks, run ------------------------------------------------------------------

RUNNABLE = [block for block in ALL if block.runnable]


def test_the_runnable_blocks_run_as_written(spawn_worker, drover_env, tmp_path) -> None:
    assert RUNNABLE, "no block is marked runnable"
    # The files first: a `.py` file the docs write is a tool module the worker must import.
    for block in RUNNABLE:
        if block.file:
            (tmp_path / block.file).write_text(block.code, encoding="utf-8")
    modules = ["drover.workers.tools.demo",
               *(Path(block.file).stem for block in RUNNABLE
                 if block.file and block.file.endswith(".py"))]
    tools = ",".join(modules)
    spawn_worker(concurrency=8, DROVER_TOOL_MODULES=tools, PYTHONPATH=str(tmp_path))
    # What a user's shell would have: drover's console script next to this interpreter.
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, **drover_env, "DROVER_TOOL_MODULES": tools,
           "PATH": os.pathsep.join([bindir, os.environ.get("PATH", "")])}
    for n, block in enumerate(RUNNABLE):
        if block.file:
            continue
        if block.lang in ("python", "py"):
            script = tmp_path / f"_block_{n}.py"
            command = [sys.executable, str(script)]
        else:
            script = tmp_path / f"_block_{n}.sh"
            command = ["bash", "-eo", "pipefail", str(script)]
        script.write_text(block.code, encoding="utf-8")
        try:
            run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True,
                                 text=True, timeout=300)
        except subprocess.TimeoutExpired as error:
            pytest.fail(f"the block at {block.where} did not end within 300 s; its output so "
                        f"far:\n{error.stdout}\n{error.stderr}")
        assert run.returncode == 0, (
            f"the block at {block.where} exited {run.returncode}:\n{block.code}\n"
            f"--- stdout\n{run.stdout[-3000:]}\n--- stderr\n{run.stderr[-3000:]}")
