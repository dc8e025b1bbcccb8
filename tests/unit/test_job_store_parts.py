"""The job store is parts, each small and named after what it holds; ``JobStore`` builds and
groups them and forwards nothing (issue 41, item 5). Read from the source: no Redis."""

from __future__ import annotations

import ast
from pathlib import Path

JOBS = Path(__file__).resolve().parents[2] / "workers" / "jobs"
PARTS = {"archive": "Archive", "cancels": "Cancels", "checkpoints": "Checkpoints",
         "counters": "Counters", "meta": "JobMeta", "outcomes": "Outcomes",
         "record_store": "Records", "specs": "Specs", "spending": "Spending",
         "stream": "Stream"}
MOST_METHODS = 12  # the largest part has 10 (Records)


def _class(module: str, name: str) -> ast.ClassDef:
    tree = ast.parse((JOBS / f"{module}.py").read_text())
    return next(node for node in tree.body
                if isinstance(node, ast.ClassDef) and node.name == name)


def _methods(cls: ast.ClassDef) -> list[str]:
    return [node.name for node in cls.body if isinstance(node, ast.FunctionDef)]


def test_the_job_store_only_builds_and_groups_its_parts():
    assert _methods(_class("store", "JobStore")) == ["__init__"]


def test_each_part_is_small_and_exported_by_its_module_and_the_package():
    import drover.workers.jobs as jobs

    for module, name in PARTS.items():
        methods = _methods(_class(module, name))
        assert len(methods) <= MOST_METHODS, (name, methods)
        tree = ast.parse((JOBS / f"{module}.py").read_text())
        exported = next(node for node in tree.body if isinstance(node, ast.Assign)
                        and any(getattr(t, "id", "") == "__all__" for t in node.targets))
        assert name in ast.literal_eval(exported.value), (module, name)
        assert name in jobs.__all__, name


def test_every_part_is_on_the_job_store_and_the_services():
    from drover.workers.services import Services

    built = _class("store", "JobStore")
    attributes = {target.attr for node in ast.walk(built) if isinstance(node, ast.Assign)
                  for target in node.targets if isinstance(target, ast.Attribute)}
    named = {"Archive": "archive", "Cancels": "cancels", "Checkpoints": "checkpoints",
             "Counters": "counters", "JobMeta": "meta", "Outcomes": "outcomes",
             "Records": "records", "Specs": "specs", "Spending": "spending",
             "Stream": "stream"}
    assert set(named.values()) <= attributes
    for attribute in set(named.values()) - {"archive"}:  # the archive is the store's own
        assert isinstance(getattr(Services, attribute, None), property), attribute
