"""Code lines of the limiter (issue 41): non-blank lines that are not comments, per file.

    python -m bench.limiter_lines [ROOT]

Lua: a line is a comment when it starts with ``--``. Python: when it starts with ``#``;
docstrings count as code (the stricter reading; the issue's figures count them), and the
count without them is printed beside.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

__all__ = ["lua_lines", "python_lines"]


def lua_lines(path: Path) -> int:
    """Non-blank lines of a .lua file that are not ``--`` comments."""
    return sum(1 for line in path.read_text().splitlines()
               if line.strip() and not line.strip().startswith("--"))


def python_lines(path: Path, docstrings: bool = True) -> int:
    """Non-blank lines of a .py file that are not ``#`` comments (nor, with
    ``docstrings=False``, docstrings)."""
    text = path.read_text()
    skip: set[int] = set()
    if not docstrings:
        for node in ast.walk(ast.parse(text)):
            body = getattr(node, "body", None)
            if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                skip.update(range(body[0].lineno, (body[0].end_lineno or 0) + 1))
    return sum(1 for n, line in enumerate(text.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and n not in skip)


def main(root: Path) -> None:
    limiter = root / "workers" / "limiter"
    lua = {p.name: lua_lines(p) for p in sorted((limiter / "lua").glob("*.lua"))}
    py = {p.name: (python_lines(p), python_lines(p, docstrings=False))
          for p in sorted(limiter.glob("*.py"))}
    print("Lua:", sum(lua.values()), "  " + ", ".join(f"{k} {v}" for k, v in lua.items()))
    print("Python:", sum(v for v, _ in py.values()),
          f"(without docstrings {sum(w for _, w in py.values())})  "
          + ", ".join(f"{k} {v}" for k, (v, _) in py.items()))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
