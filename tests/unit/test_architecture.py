"""The rooms' dependencies point one way: ``orchestrator -> workers -> config``, the simulator
stands alone, and no import (at module level or inside a function) closes a cycle between
rooms. Read from the source with ``ast``, so a lazy import inside a function counts too.

``workers/`` is rooms (packages) and, beside them, only the Celery app's public path
(``app.py``) and the composition root (``services.py``); Celery is the task layer's
(``workers/tasklayer/``); every package has ``__all__``, and a private module (``_name``) is
imported only from inside its package."""

from __future__ import annotations

import ast
import builtins
import importlib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOMS = ("config", "workers", "orchestrator", "simulator")


def _room(module: str) -> str | None:
    """``drover.workers.jobs.store`` -> ``workers.jobs``; ``drover.workers.services`` ->
    ``workers.services``; ``drover.config.settings`` -> ``config``."""
    parts = module.split(".")
    if parts[0] != "drover" or len(parts) == 1:
        return None
    if parts[1] in ("workers", "orchestrator") and len(parts) > 2:
        return f"{parts[1]}.{parts[2]}"
    return parts[1]


def _type_checking_only(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def _imports(tree: ast.Module) -> list[tuple[int, str]]:
    """Every absolute import in ``tree`` (at module level or in a function): line, module."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


# The package root's own modules below every room: the exception tree and the signals.
ROOT_MODULES = ("errors.py", "_signals.py")


def _sources() -> list[Path]:
    return sorted([p for room in ROOMS for p in (ROOT / room).rglob("*.py")]
                  + [ROOT / name for name in ROOT_MODULES])


def room_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in _sources():
        parts = path.relative_to(ROOT).with_suffix("").parts
        source = _room("drover." + ".".join(parts).removesuffix(".__init__"))
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree)
        for lineno, name in _imports(tree):
            target = _room(name)
            if lineno not in skip and target is not None and target != source:
                edges[source].add(target)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_closes_a_cycle_between_rooms():
    assert _cycle(room_graph()) is None, " -> ".join(_cycle(room_graph()) or [])


def test_dependencies_point_one_way():
    edges = room_graph()
    # The exception tree imports nothing of drover, the signals only the tree, config only it.
    assert not edges.get("errors"), f"errors.py imports {sorted(edges['errors'])}"
    assert not edges.get("_signals", set()) - {"errors"}, sorted(edges["_signals"])
    assert not edges.get("config", set()) - {"errors"}, f"config imports {sorted(edges['config'])}"
    assert not edges.get("simulator"), f"the simulator imports {sorted(edges['simulator'])}"
    upward = {(room, target) for room, targets in edges.items() if room.startswith("workers")
              for target in targets if target.startswith("orchestrator")}
    assert not upward, f"workers import the orchestrator: {sorted(upward)}"
    for low in ("workers.limiter", "workers.jobs", "workers.fairshare", "workers.recovery",
                "workers.telemetry", "workers.connections", "workers.tools", "workers.providers"):
        knows = edges.get(low, set()) & {"workers.agent", "workers.tasklayer", "workers.services",
                                         "workers.app"}
        assert not knows, f"{low} imports {sorted(knows)}, which build on it"
    # The connections build on the settings alone; the tools on telemetry alone.
    assert not edges.get("workers.connections", set()) - {"config", "errors"}
    assert not edges.get("workers.tools", set()) - {"errors", "workers.telemetry"}
    # The app's public path only names the app the task layer builds.
    assert edges.get("workers.app", set()) == {"workers.tasklayer"}
    # The client API and the operators' views know nothing of the CLI that renders them.
    for low in ("orchestrator.client", "orchestrator.ops"):
        assert "orchestrator.cli" not in edges.get(low, set()), f"{low} imports the CLI"
    # The job store knows neither the scheduler nor recovery; the scheduler not recovery.
    assert not edges.get("workers.jobs", set()) & {"workers.fairshare", "workers.recovery"}
    assert "workers.recovery" not in edges.get("workers.fairshare", set())


def test_workers_is_rooms_beside_the_apps_path_and_the_root():
    """A newcomer reading ``workers/`` sees the architecture: one folder per concern, and
    loose only the module ``celery -A drover.workers.app`` names and the composition root."""
    workers = ROOT / "workers"
    assert sorted(p.name for p in workers.glob("*.py")) == ["__init__.py", "app.py", "services.py"]
    rooms = [p for p in workers.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))]
    assert rooms and all((room / "__init__.py").is_file() for room in rooms), rooms


def _defines_all(path: Path) -> bool:
    for node in ast.parse(path.read_text(), str(path)).body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return True
    return False


def test_every_package_says_what_it_exports():
    packages = [p for room in ROOMS for p in (ROOT / room).rglob("__init__.py")]
    missing = [str(p.relative_to(ROOT)) for p in packages + [ROOT / "__init__.py"]
               if not _defines_all(p)]
    assert not missing, missing


def _module_of(path: Path) -> str:
    dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return "drover." + dotted.removesuffix(".__init__")


def _imported_modules(tree: ast.Module) -> list[tuple[int, str]]:
    """``_imports``, plus ``from package import name`` read as ``package.name`` too."""
    found = _imports(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _private_package(name: str) -> str | None:
    """``drover.workers.jobs._decode`` -> ``drover.workers.jobs``: the package whose private
    module ``name`` is (or is inside); None when it names no private module of drover's."""
    parts = name.split(".")
    if parts[0] != "drover":
        return None
    for i, part in enumerate(parts[1:], start=1):
        if part.startswith("_") and not part.startswith("__"):
            here = ROOT.joinpath(*parts[1:i + 1])
            if here.with_suffix(".py").is_file() or (here / "__init__.py").is_file():
                return ".".join(parts[:i])
    return None


def test_a_private_module_is_imported_only_inside_its_package():
    """In the package and the benchmarks (a test may look inside what it tests)."""
    leaks = []
    for path in _sources() + sorted((ROOT / "bench").rglob("*.py")):
        inside = path.relative_to(ROOT).parts[0] != "bench"
        importer = _module_of(path) if inside else "bench"
        for lineno, name in _imported_modules(ast.parse(path.read_text(), str(path))):
            package = _private_package(name)
            if package and not (importer + ".").startswith(package + "."):
                leaks.append(f"{path.relative_to(ROOT)}:{lineno} imports {name}")
    assert not leaks, leaks


def test_no_module_imports_another_modules_private_name():
    """A ``_name`` is its module's own: what two modules share is public in one of them (in a
    private module when only its package may use it)."""
    leaks = []
    for path in _sources() + sorted((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("drover"):
                leaks += [f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}."
                          f"{alias.name}" for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")
                          and _private_package(f"{node.module}.{alias.name}") is None]
    assert not leaks, leaks


def test_nothing_in_workers_imports_the_package_above_or_the_orchestrator():
    """The package's root imports ``workers/`` (``drover.tool``, ``drover.app``), never the
    other way round: ``from drover import tool`` in a worker module is a cycle through the
    root that the room graph does not see."""
    upward = []
    for path in sorted((ROOT / "workers").rglob("*.py")):
        for lineno, name in _imports(ast.parse(path.read_text(), str(path))):
            if name == "drover" or name.startswith("drover.orchestrator"):
                upward.append(f"{path.relative_to(ROOT)}:{lineno} imports {name}")
    assert not upward, upward


def test_celery_is_the_task_layers():
    """The agent, the job store, the scheduler, recovery and the other rooms know no Celery:
    they are handed what to send (the connections speak to the broker through kombu)."""
    leaks = []
    for path in sorted((ROOT / "workers").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[1] == "tasklayer":
            continue
        leaks += [f"{rel}:{lineno} imports {name}"
                  for lineno, name in _imports(ast.parse(path.read_text(), str(path)))
                  if name.split(".")[0] == "celery"]
    assert not leaks, leaks


PROVIDER_SDKS = ("anthropic", "openai")


def test_only_the_providers_room_imports_a_provider_sdk():
    """Anthropic's and OpenAI's SDKs live behind the provider seam (workers/providers/): any
    import of one elsewhere in the package, at module level, in a function or for type
    checking only, is a provider's specifics leaking out of its room."""
    leaks = []
    for path in sorted(p for room in ROOMS for p in (ROOT / room).rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[:2] == ("workers", "providers") or rel.parts[0] == "simulator":
            continue  # the simulator stands alone and speaks the providers' wire shapes
        leaks += [f"{rel}:{lineno} imports {name}"
                  for lineno, name in _imports(ast.parse(path.read_text(), str(path)))
                  if name.split(".")[0] in PROVIDER_SDKS]
    assert not leaks, leaks


def test_the_providers_room_builds_on_nothing_of_drover_but_config():
    """The seam is the bottom of the call path: agent code asks it, it asks nobody."""
    assert not edges_of("workers.providers") - {"config"}


def edges_of(room: str) -> set[str]:
    return room_graph().get(room, set())


def test_every_test_file_name_is_unique_across_the_tiers():
    """The test folders are no packages, so pytest imports each test file by its bare name:
    two files of one name in two tiers stop the whole suite at collection ("import file
    mismatch"), which running one tier alone (landing's unit tier) never shows."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, list[str]] = defaultdict(list)
    for path in sorted(tests.rglob("test_*.py")):
        seen[path.name].append(str(path.relative_to(tests)))
    assert not {name: where for name, where in seen.items() if len(where) > 1}


def _exception_classes() -> dict[str, list[str]]:
    """Every exception class defined in the package (the simulator aside: it stands alone and
    its errors become HTTP answers), by the file that defines it. Read with ``ast``: a class
    is an exception when a base is a built-in exception or, transitively, one of these."""
    defined: list[tuple[str, str, set[str]]] = []
    for path in _sources():
        if path.relative_to(ROOT).parts[0] == "simulator":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                         if isinstance(b, ast.Name | ast.Attribute)}
                defined.append((str(path.relative_to(ROOT)), node.name, bases))
    known = {name for name, value in vars(builtins).items()
             if isinstance(value, type) and issubclass(value, BaseException)}
    found: dict[str, list[str]] = defaultdict(list)
    grew = True
    while grew:
        grew = False
        for where, name, bases in defined:
            if bases & known and name not in found[where]:
                found[where].append(name)
                known.add(name)
                grew = True
    return {where: names for where, names in found.items() if names}


def test_every_exception_is_in_the_tree_or_among_the_signals():
    """A user's exceptions are in drover/errors.py, the internal control-flow signals in
    drover/_signals.py; an exception class anywhere else is one a reader cannot place."""
    elsewhere = {where: names for where, names in _exception_classes().items()
                 if where not in ROOT_MODULES}
    assert not elsewhere, elsewhere


def test_every_public_exception_descends_from_drover_error_and_is_exported():
    import drover
    import drover.errors as errors

    defined = {name for name, value in vars(errors).items()
               if isinstance(value, type) and issubclass(value, BaseException)
               and value.__module__ == errors.__name__}
    assert defined == set(errors.__all__)
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.DroverError), name
        assert name in drover.__all__ and getattr(drover, name) is cls, name


def test_each_error_keeps_its_standard_parent():
    """So ``except LookupError`` and the like, written before the tree, still catch them."""
    import drover

    assert issubclass(drover.JobNotFound, LookupError)
    assert issubclass(drover.Unreachable, RuntimeError)
    assert issubclass(drover.SettingsError, ValueError)
    assert issubclass(drover.JobRefused, ValueError)
    assert issubclass(drover.WaitTimeout, TimeoutError)
    assert issubclass(drover.NeverFits, drover.CallFailed)


def test_every_signal_is_private_and_says_why_it_is_an_exception():
    signals = importlib.import_module("drover._signals")
    import drover

    for name in signals.__all__:
        cls = getattr(signals, name)
        assert name not in drover.__all__, name
        why = " ".join((cls.__doc__ or "").lower().split())
        assert "an exception because" in why or "an exception for" in why, name


def test_tests_share_helpers_only_through_tests_helpers():
    """A test module imported by another runs its fixtures and module-level code twice and
    ties two tiers together; what tests share lives in tests/helpers/."""
    tests = Path(__file__).resolve().parents[1]
    leaks = []
    for path in sorted(tests.rglob("*.py")):
        for lineno, name in _imports(ast.parse(path.read_text(), str(path))):
            parts = name.split(".")
            if (parts[0] == "tests" and len(parts) > 1 and parts[1] != "helpers"
                    or parts[0].startswith("test_") or parts[0] == "conftest"):
                leaks.append(f"{path.relative_to(tests)}:{lineno} imports {name}")
    assert not leaks, leaks


# Issue 41: one composition root per process. ``services()`` is asked only where a process
# builds what it shares: the CLI's commands, the submitter's first call, the worker's Celery
# app (``app.drover``); everything else is handed its parts (a ``Services``, ``rt.shared``,
# ``handle.shared``, ``consumer.app.drover``).
SERVICE_ROOTS = {"orchestrator/cli/commands.py", "orchestrator/client/jobs.py",
                 "workers/tasklayer/app.py"}


def test_services_is_called_only_at_the_roots():
    calling = set()
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel == "workers/services.py":  # where it is defined (and the recorder's hook)
            continue
        tree = ast.parse(path.read_text())
        if any(isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
               and node.func.id == "services" for node in ast.walk(tree)):
            calling.add(rel)
    assert calling <= SERVICE_ROOTS, sorted(calling - SERVICE_ROOTS)
    assert len(SERVICE_ROOTS) <= 3


# What the root builds (``Services``): the Redis clients, the limiters, the schedulers, the
# stores, the heartbeat and the recorder. A part built elsewhere has a configuration and
# connections of its own; the roots themselves ask ``services()`` for them.
BUILT_AT_THE_ROOT = {"sync_redis", "async_redis", "Limiter", "AsyncLimiter", "FairShare",
                     "FairShare.from_settings", "JobStore", "BatchStore", "ResultsStore",
                     "Heartbeat", "Recorder"}
# The files besides workers/services.py that must build one, each with why.
BUILDS_ITS_OWN = {
    "workers/connections/preflight.py":
        "first contact, before any root has built a part: clients that give up within seconds",
    "orchestrator/cli/demo.py":
        "deletes its run's keys once its parts are gone, with a client that gives up at once",
}


def _builds(tree: ast.Module) -> set[str]:
    """The names in ``BUILT_AT_THE_ROOT`` that ``tree`` calls (``x.Limiter(...)`` too)."""
    called = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                called.add(func.id)
            elif isinstance(func, ast.Attribute):
                called.add(func.attr)
                if isinstance(func.value, ast.Name):
                    called.add(f"{func.value.id}.{func.attr}")
    return called & BUILT_AT_THE_ROOT


def test_only_the_root_builds_clients_limiters_schedulers_and_stores():
    building = {}
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        built = _builds(ast.parse(path.read_text(), str(path)))
        if built and rel != "workers/services.py":
            building[rel] = sorted(built)
    assert set(building) <= set(BUILDS_ITS_OWN), {
        rel: names for rel, names in building.items() if rel not in BUILDS_ITS_OWN}
    # The list stays exact: a file that no longer builds one leaves it.
    assert set(BUILDS_ITS_OWN) <= set(building), sorted(set(BUILDS_ITS_OWN) - set(building))


# What the worker's call path loads: a provider SDK, the providers room, the agent loop and the
# task module. A submitting process and the CLI's read commands load none of it (the tasks go
# by name): a first submit costs its round trips, not a second of imports (bench/first_submit.py).
CALL_PATH = ("anthropic", "openai", "httpx", "drover.workers.providers",
             "drover.workers.tasklayer.tasks", "drover.workers.agent.llm",
             "drover.workers.agent.subagent", "drover.workers.agent.loop",
             "drover.workers.agent.runtime",
             "drover.workers.agent.batch", "drover.workers.agent.join",
             "drover.workers.agent.planning", "drover.workers.agent.retry")

_LOADED = """
import json, runpy, sys
{body}
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("anthropic", "openai",
      "httpx") or m.startswith(("drover.workers.agent.", "drover.workers.providers",
                                "drover.workers.tasklayer.")))))
"""


def _loaded_after(body: str, redis_url: str, key_prefix: str) -> tuple[list[str], list[str]]:
    """What ``body`` printed, and the modules of the call path's packages it loaded."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "DROVER_REDIS_URL": redis_url, "DROVER_KEY_PREFIX": key_prefix,
           "DROVER_QUEUE": f"q-{key_prefix}"}
    env.pop("DROVER_BROKER_URL", None)
    done = subprocess.run([sys.executable, "-c", _LOADED.format(body=body)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    *printed, loaded = done.stdout.splitlines()
    return printed, json.loads(loaded)


def test_a_submit_and_its_handle_load_no_sdk_and_none_of_the_call_path(redis_url, key_prefix):
    _, loaded = _loaded_after(
        "from drover import JobHandle, JobSpec, submit\n"
        "handle = submit(JobSpec(subtasks=[f'item {i}' for i in range(300)], max_tokens=50))\n"
        "again = JobHandle.attach(handle.id)\n"
        "again.progress(); again.result(); again.status; list(again.records())\n"
        "submit(JobSpec(goal='plan three things', max_tokens=50))\n",
        redis_url, key_prefix)
    assert "drover.workers.tasklayer.submitting" in loaded  # it did send, from this process
    assert [m for m in loaded if m.startswith(CALL_PATH)] == []


def test_the_clis_read_commands_load_no_sdk_and_none_of_the_call_path(redis_url, key_prefix):
    # A job that ended (no worker runs here: its result is stored as the join would).
    printed, _ = _loaded_after(
        "from drover import JobSpec, submit\n"
        "from drover.workers.jobs.records import JobResult, Usage\n"
        "from drover.workers.services import services\n"
        "handle = submit(JobSpec(subtasks=['a', 'b'], max_tokens=50))\n"
        "services().store.outcomes.save(JobResult(job_id=handle.id, status='cancelled', "
        "results=[], counts={}, usage=Usage(), wall_s=1.0))\n"
        "print(handle.id)\n", redis_url, key_prefix)
    job_id = printed[-1]
    for command in (["jobs"], ["result", job_id], ["result", "--json", job_id],
                    ["watch", job_id]):
        _, loaded = _loaded_after(
            f"sys.argv = ['drover', *{command!r}]\n"
            "try:\n    runpy.run_module('drover.orchestrator.cli', run_name='__main__')\n"
            "except SystemExit as end:\n    assert end.code in (0, 1), end.code\n",
            redis_url, key_prefix)
        assert [m for m in loaded if m.startswith(CALL_PATH)] == [], command
