"""Tools that work offline, for ``drover demo`` and the tests.

They stand in for what real sub-agents call (a search index, a calculator, a notes service):
deterministic, no network.
"""

from __future__ import annotations

import ast
import hashlib
import operator
import threading
from collections.abc import Callable

from drover.workers.tools import tool

_FACTS = (
    "grew steadily over the last decade", "is limited mostly by supply", "depends on regulation",
    "has three large competitors", "is cheaper to run than it was five years ago",
    "saw most growth in Asia", "is moving to subscription pricing", "has a long sales cycle",
)


@tool(kind="read", timeout_s=5)
def lookup_fact(topic: str) -> str:
    """Look up a short fact about a topic in the offline knowledge base."""
    digest = int(hashlib.sha256(topic.lower().encode()).hexdigest(), 16)
    return f"{topic}: {_FACTS[digest % len(_FACTS)]} (source: kb#{digest % 997})"


_OPS: dict[type[ast.AST], Callable[..., float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.Pow: operator.pow, ast.USub: operator.neg,
    ast.Mod: operator.mod}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        if isinstance(node.op, ast.Pow) and abs(_eval(node.right)) > 100:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError("only numbers and + - * / % ** are allowed")


@tool(kind="read", timeout_s=2)
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / % ** and parentheses."""
    try:
        return str(_eval(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as error:
        raise ValueError(f"cannot evaluate {expression!r}: {error}") from None


NOTES: dict[str, str] = {}
_notes_lock = threading.Lock()


@tool(kind="write", timeout_s=5)
def save_note(title: str, text: str, idempotency_key: str = "") -> str:
    """Save a note for the final report. Saving the same call twice keeps one note."""
    with _notes_lock:
        key = idempotency_key or title
        created = key not in NOTES
        NOTES[key] = f"{title}: {text}"
    return "saved" if created else "already saved"
