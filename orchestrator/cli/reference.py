"""Write docs/cli.md from the CLI's own parsers: ``python -m drover.orchestrator.cli.reference``.

The page is each command's ``--help`` as argparse prints it (drover's formatter has a fixed
width, so the text does not depend on the terminal), in the order ``drover --help`` lists
them. tests/test_docs.py fails when the committed page differs from what this prints.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["COMMAND", "render"]

COMMAND = "python -m drover.orchestrator.cli.reference > docs/cli.md"


@contextmanager
def _plain_environment() -> Iterator[None]:
    """Help texts show defaults some of which come from DROVER_* (the worker's queue), and
    argparse wraps at the terminal's width (COLUMNS) where a parser does not fix one: the page
    shows an unset environment's defaults at 100 columns, whatever this shell has."""
    saved = {key: value for key, value in os.environ.items()
             if key.startswith("DROVER_") or key == "COLUMNS"}
    for key in saved:
        del os.environ[key]
    os.environ["COLUMNS"] = "100"
    try:
        yield
    finally:
        del os.environ["COLUMNS"]
        os.environ.update(saved)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps the subparsers here and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _section(title: str, text: str) -> list[str]:
    return [f"## `{title}`", "", "```text", text.rstrip("\n"), "```", ""]


def render() -> str:
    """The whole page, as docs/cli.md holds it."""
    from drover.orchestrator.cli import commands as cli
    from drover.simulator.cli import build_parser

    with _plain_environment():
        top = cli.parser()
        lines = [
            "# Command line reference",
            "",
            f"<!-- Generated from the parsers in orchestrator/cli/commands.py by `{COMMAND}`; "
            "do not edit. -->",
            "",
            "Every command takes its settings from the `DROVER_*` environment variables "
            "([settings](settings.md)) and exits with the codes of "
            "[troubleshooting](troubleshooting.md#exit-codes).",
            "",
            *_section("drover", top.format_help()),
        ]
        for name, sub in _subcommands(top).items():
            if name == "worker":  # its options are parsed apart, the rest go to Celery
                text = cli.worker_parser().format_help()
            elif name == "sim":
                text = build_parser(prog="drover sim").format_help()
            elif name == "flower":  # its options are Flower's: drover's rules are its HELP
                from drover.orchestrator.ops.flower import HELP as text
            else:
                text = sub.format_help()
            lines += _section(f"drover {name}", text)
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
