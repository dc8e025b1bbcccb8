"""``drover.workers.agent`` imports its modules when a name is first used (a light module
of it, such as ``limits``, must not pull in the anthropic SDK), and its names are the same
objects the eager imports gave."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_light_module_of_the_package_does_not_import_the_sdk():
    assert _run("import sys\n"
                "import drover.workers.agent.limits, drover.workers.agent.caching\n"
                "print('anthropic' in sys.modules)") == "False"


def test_join_stays_the_function_when_its_submodule_is_imported_first():
    # Importing a submodule binds it to the package's attribute of the same name.
    assert _run("import inspect\n"
                "from drover.workers.agent.join import collect\n"
                "from drover.workers.agent import join, Incomplete\n"
                "import drover.workers.tasklayer.tasks as tasks\n"
                "print(inspect.isfunction(join), tasks.join is join, Incomplete.__name__)"
                ) == "True True Incomplete"


def test_every_exported_name_resolves():
    import drover.workers.agent as agent

    for name in agent.__all__:  # the exceptions live in the tree or among the signals
        home = getattr(agent, name).__module__
        assert home.startswith("drover.workers.agent.") or home in (
            "drover.errors", "drover._signals"), name
