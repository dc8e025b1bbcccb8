"""The ``drover`` command line.

Exit codes, the same for the same situation in every command (docs/troubleshooting.md has
the table):

- 0: done, and every sub-agent ended ``ok`` (or the command did what it was asked);
- 1: the job ended, but not every sub-agent is ``ok`` (failed, cancelled, over a budget),
  or the job itself failed or was cancelled; ``drover cancel``: the job had already ended;
- 2: usage or settings error: a bad option, setting, spec or job id, a missing extra, or a
  worker that cannot work (no API key, a tool module that does not import);
- 3: Redis or the broker does not answer (found out within a few seconds);
- 4: ``drover result``: the job has not finished yet;
- 130: interrupted (Ctrl-C).

Expected failures print one message that says what to do, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from drover._signals import Refused
from drover.config import SettingsError

OK, NOT_ALL_OK, USAGE, UNREACHABLE, NOT_FINISHED, INTERRUPTED = 0, 1, 2, 3, 4, 130
# Output that is not a terminal (a pipe, a file, CI) gets this many columns instead of
# rich's 80, so tables do not wrap mid-word; COLUMNS still wins when set.
WIDE = 200


def make_console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    wide = not stream.isatty() and not os.environ.get("COLUMNS")
    return Console(stderr=stderr, width=WIDE if wide else None)


console = make_console()


def _settings() -> Any:
    from drover.config import get_settings

    return get_settings()


def _shared(settings: Any) -> Any:
    """The CLI's root: this process's parts (Redis, the stores, the limiter, the scheduler)
    for ``settings``, built once; each command hands the views what they read."""
    from drover.workers.services import services

    return services(settings)


def _need_services(settings: Any, *, broker: bool = False) -> None:
    """Fail in seconds, naming the variable, when Redis (or the broker) does not answer."""
    from drover.workers.connections.preflight import Unreachable, check_services

    try:
        check_services(settings, broker=broker)
    except Unreachable as error:
        raise Refused(str(error), UNREACHABLE) from None


def _needs_extra(error: ImportError, what: str, alternative: str = "") -> Refused:
    module = error.name or "a module"
    return Refused(f"{what} needs {module}, which is not installed: install drover's demo "
                   f"extra, python3 -m pip install -e \".[demo]\" (or pip install "
                   f"'drover[demo]'){alternative}")


# --- demo -------------------------------------------------------------------------------------

def _demo(args: argparse.Namespace) -> int:
    from drover.orchestrator.cli.demo import DemoConfig, run_demo, run_demo_on_services

    plot = None if args.no_plot else Path(args.plot)
    if plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError as error:
            raise _needs_extra(error, "the demo's plot", "; or pass --no-plot") from None
    config = DemoConfig(subagents=args.subagents, concurrency=args.concurrency,
                        rpm=args.rpm, plot=plot, keep=args.keep, batch=args.batch)
    if args.on_services:
        settings = _settings()
        _need_services(settings, broker=True)
        return run_demo_on_services(config, console)
    try:
        return run_demo(config, console)
    except ImportError as error:
        if error.name == "fakeredis":
            raise _needs_extra(error, "the demo without a Redis or redis-server",
                               "; or install redis-server (Debian: apt-get install "
                               "redis-server), or point DROVER_REDIS_URL at a Redis") from None
        raise


# --- sim, worker, flower: their options go on to the simulator, Celery, Flower ----------------

def _sim(args: argparse.Namespace) -> int:
    from drover.simulator.cli import main as sim_main

    return sim_main(args.rest, prog="drover sim")


WORKER_DEFAULTS = (("--pool", "-P", "threads", "the Celery pool: drover's sub-agents are "
                    "coroutines on one event loop per process, Celery's threads are the slots"),
                   ("--concurrency", "-c", "32", "worker slots (threads) per process; Celery's "
                    "own help below says the CPU count, drover's default is 32"),
                   ("--queues", "-Q", None, "the queue to consume: DROVER_QUEUE"),
                   ("--loglevel", "-l", "INFO", "log level; one line per LLM call at INFO, no "
                    "prompt text at any level"),
                   ("--hostname", "-n", "celery@HOST", "the Celery node name: the first of "
                    "celery@HOST, celery2@HOST, ... that no live worker of this host holds, so "
                    "several workers on one host are distinct nodes"))


def worker_parser() -> argparse.ArgumentParser:
    queue = os.environ.get("DROVER_QUEUE") or "drover"  # empty counts as unset
    parser = argparse.ArgumentParser(
        prog="drover worker", formatter_class=_Formatter, add_help=False,
        usage="drover worker [drover's options] [any `celery worker` option]",
        description=_wrap("Start a Celery worker for drover's tasks "
        "(celery -A drover.workers.app worker) "
        "with drover's defaults. It refuses to start, saying what to fix, without an API key "
        "(ANTHROPIC_API_KEY, unless DROVER_ANTHROPIC_BASE_URL points at a proxy that needs "
        "none), with a DROVER_TOOL_MODULES module that does not import, or when Redis or the "
        "broker does not answer. drover's simulator (drover sim) needs a key, as the API "
        "does, and takes any: ANTHROPIC_API_KEY=sk-sim. Tool modules import from the folder "
        "the worker starts in, as with `celery worker`."),
        epilog=_wrap("Every other option goes to `celery worker` unchanged; Celery's own help "
        "follows. Exit status: 2 settings, API key or tool module; 3 Redis or broker "
        "unreachable; otherwise Celery's."))
    ours = parser.add_argument_group("drover's options (defaults given here replace Celery's)")
    for long, short, default, text in WORKER_DEFAULTS:
        default = default or queue
        ours.add_argument(short, long, default=default, metavar=long.strip("-").upper(),
                          help=text)
    ours.add_argument("-h", "--help", action="store_true", help="show this help and Celery's")
    return parser


def _worker(args: argparse.Namespace) -> int:
    if any(a in ("-h", "--help") for a in args.rest):
        worker_parser().print_help()
        print("\n--- celery worker --help " + "-" * 50, flush=True)
        from drover.workers.app import app

        return _celery_exit(app.worker_main, ["worker", "--help"])
    from drover.workers.connections.preflight import WorkerCannotStart, check_worker
    from drover.workers.tasklayer.nodenames import claim_node_name, names_a_node

    settings = _settings()
    try:
        check_worker(settings)
    except WorkerCannotStart as error:
        raise Refused(str(error), error.exit_code) from None
    os.environ["_DROVER_WORKER_CHECKED"] = "1"  # the celeryd_init check need not run again
    from drover.workers.app import app

    argv = ["worker", "--pool", "threads", "--concurrency", "32", "--queues", settings.queue,
            "--loglevel", "INFO", *args.rest]
    if not names_a_node(args.rest):  # several workers on one host: a name each
        argv[1:1] = ["--hostname", claim_node_name(_shared(settings).redis,
                                                   settings.key_prefix)]
    return _celery_exit(app.worker_main, argv)


def _celery_exit(fn: Any, argv: list[str]) -> int:
    try:
        return int(fn(argv) or 0)
    except SystemExit as done:  # click ends with SystemExit; keep its status
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 2)


def _flower(args: argparse.Namespace) -> int:
    from drover.orchestrator.ops.flower import run_flower

    return run_flower(args.rest)


# --- submit, watch, result, cancel ------------------------------------------------------------

def _spec_fields() -> str:
    """JobSpec's fields but the three named first, each with its choices where it has some:
    read from the model, so the help never leaves a field out."""
    import typing

    from drover.workers.jobs.spec import JobSpec

    names = []
    for name, field in JobSpec.model_fields.items():
        if name in ("subtasks", "goal", "max_subtasks"):
            continue
        kind = field.annotation
        while typing.get_origin(kind) is typing.Annotated:
            kind = typing.get_args(kind)[0]
        choices = typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else ()
        names.append(f"{name} ({' | '.join(map(str, choices))})" if choices else name)
    return ", ".join(names)


def spec_format() -> str:
    import textwrap

    fields = textwrap.fill(
        'The job spec is a JSON object (a JobSpec): either "subtasks", a list of tasks (one '
        'sub-agent each), or a "goal" the model plans into at most "max_subtasks" sub-agents, '
        'or "subagent", the name of an @drover.subagent function, with "inputs", one JSON '
        'value per sub-agent (docs/own-code.md). '
        f"Other fields (docs/jobs.md): {_spec_fields()}.", width=95, break_on_hyphens=False)
    return f"""\
{fields}

Example (job.json):
  {{"subtasks": ["Summarise vendor A", "Summarise vendor B"],
   "system": "You are a careful analyst.", "max_tokens": 400,
   "tools": ["lookup_fact"], "deadline_s": 600, "tenant": "research"}}

  drover submit job.json --wait
  echo '{{"goal": "Compare vendors A and B", "max_subtasks": 4}}' | drover submit -

Exit status: 0 enqueued (with --wait: done, every sub-agent ok); 1 (--wait) the job ended
with failed, cancelled or over-budget sub-agents, or failed; 2 a bad spec or setting (nothing
enqueued); 3 Redis or the broker does not answer."""


def _spec_error_lines(path: str, error: ValidationError) -> list[str]:
    lines = [f"the job spec {path!r} is not valid; nothing was enqueued:"]
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(spec)"
        message = item["msg"].removeprefix("Value error, ")  # an unknown field's names the closest
        if item["type"] == "json_invalid":
            message = f"not valid JSON: {item.get('ctx', {}).get('error', message)}"
        lines.append(f"  {where}: {message}")
    return lines


def _load_spec(path: str) -> object:
    from drover.workers.jobs.spec import JobSpec

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as error:
        raise Refused(f"cannot read the job spec {path!r}: {error.strerror}") from None
    try:
        return JobSpec.model_validate_json(text)
    except ValidationError as error:
        raise Refused("\n".join(_spec_error_lines(path, error))) from None


def _submit(args: argparse.Namespace) -> int:
    spec = _load_spec(args.spec)  # a bad spec is reported without needing Redis
    settings = _settings()
    _need_services(settings, broker=True)
    from drover.orchestrator.client.jobs import (
        submit,  # Celery and the SDK: only once they can be used
    )
    from drover.workers.connections.preflight import tool_module_problem
    try:
        handle = submit(spec, settings=settings)  # type: ignore[arg-type]
    except ImportError as error:
        name = next((m for m in settings.tool_modules if error.name and
                     (m == error.name or m.startswith(error.name + "."))), error.name or "?")
        raise Refused(f"refused, nothing was enqueued: {tool_module_problem(name, error)}"
                      ) from None
    except ValueError as error:
        raise Refused(f"refused, nothing was enqueued: {error}") from None
    try:  # the job is enqueued: from here on a Ctrl-C leaves it running, and says so
        console.print(handle.id)
        result = _wait(handle, settings) if args.wait else None
    except KeyboardInterrupt:
        _say(f"stopped{' waiting' if args.wait else ''}; job {handle.id} keeps running on the "
             f"workers. Follow it with `drover watch {handle.id}`, its result: `drover result "
             f"{handle.id}`, stop it: `drover cancel {handle.id}`")
        return INTERRUPTED
    return OK if result is None else _print_result(result, handle)


def _estimate(args: argparse.Namespace) -> int:
    spec = _load_spec(args.spec)  # nothing is sent: no Redis, no broker needed
    settings = _settings()
    from drover.orchestrator.client.estimates import estimate
    try:
        found = estimate(spec, settings=settings,  # type: ignore[arg-type]
                         mean_output_tokens=args.mean_output)
    except ValueError as error:
        raise Refused(str(error)) from None
    console.print(found.table())
    return OK


def _retry(args: argparse.Namespace) -> int:
    _need_services(_settings(), broker=True)  # the sub-agents go out again
    handle = _handle(args.job)
    from drover.errors import JobNotFound, JobRefused
    try:
        indexes = handle.retry()
    except (JobNotFound, JobRefused) as error:
        raise Refused(str(error)) from None
    if not indexes:
        _say(f"nothing to retry: every sub-agent of job {handle.id} ended ok")
        return OK
    shown = ", ".join(map(str, indexes[:20])) + (", ..." if len(indexes) > 20 else "")
    _say(f"job {handle.id}: {len(indexes)} sub-agents sent again ({shown}); the ok ones are "
         "kept")
    if not args.wait:
        return OK
    try:
        result = _wait(handle, handle.settings)
    except KeyboardInterrupt:
        _say(f"stopped waiting; job {handle.id} keeps running on the workers")
        return INTERRUPTED
    return _print_result(result, handle)


def _wait(handle: Any, settings: Any) -> Any:
    """The job's result; if nothing finishes for a while, the handle's wait says whether a
    worker serves the queue (orchestrator/client/workers.py), here as a `drover:` line."""
    import logging

    say = logging.StreamHandler(sys.stderr)
    say.setFormatter(logging.Formatter("drover: %(message)s"))
    client_log = logging.getLogger("drover.orchestrator.client")
    client_log.addHandler(say)
    client_log.propagate = False
    try:
        return handle.wait()
    finally:
        client_log.removeHandler(say)
        client_log.propagate = True


def _handle(job_id: str):  # noqa: ANN202
    settings = _settings()
    _need_services(settings)
    from drover.orchestrator.client.jobs import JobHandle, JobNotFound
    try:
        return JobHandle.attach(job_id, settings=settings)
    except JobNotFound as error:
        raise Refused(f"{error} (DROVER_REDIS_URL and DROVER_KEY_PREFIX must be the ones it "
                      "was submitted with)") from None


def exit_code(result: Any) -> int:
    """0 when the job is done and every sub-agent ok, else 1."""
    all_ok = all(r.status == "ok" for r in result.results)
    return OK if result.status == "done" and all_ok else NOT_ALL_OK


def _cache_line(handle: Any, result: Any) -> str | None:
    """Why nothing was cached, if nothing was (None otherwise, or if the spec is gone)."""
    from drover.workers.agent.caching import cache_line
    from drover.workers.connections.preflight import import_tool_modules
    from drover.workers.tools import REGISTRY

    usage = result.usage
    if usage.cache_read_input_tokens or usage.cache_creation_input_tokens:
        return None
    try:
        spec = handle.store.specs.get(result.job_id)
    except Exception:  # expired, or another prefix: the line is a nicety
        return None
    if spec.tools:
        try:
            import_tool_modules(handle.settings)  # for the definitions' size
        except Exception:
            pass
    tool_chars = sum(len(json.dumps(REGISTRY[name].definition())) for name in spec.tools or ()
                     if name in REGISTRY)
    return cache_line(result.usage, spec, spec.model or handle.settings.model, tool_chars)


def _print_result(result: Any, handle: Any = None) -> int:
    table = Table(title=f"job {result.job_id}: {result.status}"
                  + (f" ({result.reason})" if result.reason else ""))
    from drover.orchestrator.cli.watch import dollars, usage_lines

    unanswered = result.usage.unanswered_calls > 0
    columns = ("#", "status", "calls", *(("unanswered",) if unanswered else ()), "in", "out",
               "cost", "attempts", "error / summary")
    for column in columns:
        table.add_column(column, no_wrap=column != "error / summary")
    for r in result.results:
        # A job ended as a whole (its key refused) gives every record its reason: said once.
        error = "the job's reason, above" if r.error and r.error == result.reason else r.error
        note = f"{r.status_code or ''} {r.error_type}: {error}" if r.error else r.summary
        lost = (str(r.usage.unanswered_calls),) if unanswered else ()
        table.add_row(str(r.index), r.status, str(r.usage.calls), *lost,
                      str(r.usage.input_tokens), str(r.usage.output_tokens), dollars(r.usage),
                      str(r.attempts),
                      (note or "")[:80])
    console.print(table)
    console.print(" ".join(f"{k}={v}" for k, v in result.counts.items()),
                  f"wall={result.wall_s:.1f}s")
    for line in usage_lines(result.usage):
        console.print(line, markup=False)
    cache = _cache_line(handle, result) if handle is not None else None
    if cache:
        console.print(cache, highlight=False)
    if result.synthesis:
        console.print("\n[bold]Synthesis[/]\n" + result.synthesis)
    return exit_code(result)


def _result(args: argparse.Namespace) -> int:
    handle = _handle(args.job)
    result = handle.result()
    if result is None:
        console.print(f"job {args.job} is {handle.status}: {handle.progress()}")
        return NOT_FINISHED
    if args.json:
        console.print_json(result.model_dump_json())
        return exit_code(result)
    return _print_result(result, handle)


def _cancel(args: argparse.Namespace) -> int:
    handle = _handle(args.job)
    if handle.cancel(args.reason):
        console.print(f"cancelling job {args.job} on every worker")
        return OK
    console.print(f"job {args.job} had already ended ({handle.status})")
    return NOT_ALL_OK


def _watch(args: argparse.Namespace) -> int:
    from drover.orchestrator.cli.watch import watch

    handle = _handle(args.job)
    try:
        return watch(handle, console)
    except KeyboardInterrupt:
        _say(f"stopped watching; job {handle.id} keeps running on the workers "
             f"(`drover cancel {handle.id}` stops it)")
        return INTERRUPTED


def _stats(args: argparse.Namespace) -> int:
    plot = Path(args.plot) if args.plot else None
    if plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError as error:
            raise _needs_extra(error, "drover stats --plot") from None
    settings = _settings()
    _need_services(settings)
    from drover.orchestrator.ops.stats import print_stats

    return print_stats(console, _shared(settings), plot=plot)


def _metrics(args: argparse.Namespace) -> int:
    settings = _settings()
    _need_services(settings)
    from drover.orchestrator.ops.metrics import serve

    return _listening("metrics", serve, settings, args)


def _listening(command: str, serve: Any, settings: Any, args: argparse.Namespace) -> int:
    """Run a server command's ``serve`` on --addr:--port; a port it cannot take is refused
    in one line."""
    try:
        return int(serve(_shared(settings), args.port, args.addr))
    except OSError as error:
        raise Refused(f"drover {command} cannot listen on {args.addr}:{args.port}: "
                      f"{error.strerror or error}; pick another --port or --addr") from None


def _listen_options(command: argparse.ArgumentParser, port: int) -> None:
    command.add_argument("--port", type=int, default=port, help="port to listen on")
    command.add_argument("--addr", default="127.0.0.1",
                         help="address to listen on (0.0.0.0 for every interface)")


def _gateway(args: argparse.Namespace) -> int:
    import logging

    settings = _settings()
    _need_services(settings)
    from drover.orchestrator.gateway import serve

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: "
                        "%(message)s")
    logging.getLogger("drover.gateway").setLevel(logging.INFO if args.verbose else
                                                 logging.WARNING)
    return _listening("gateway", serve, settings, args)


def _jobs(args: argparse.Namespace) -> int:
    settings = _settings()
    _need_services(settings)
    from drover.orchestrator.ops.shares import active_jobs, jobs_table, tenants_table

    shared = _shared(settings)
    fs = shared.fairshare()
    active = active_jobs(settings, fs)
    if args.finished:
        _print_finished(shared, args.finished)
    if not active:
        console.print(f"no active jobs on queue {settings.queue!r} (DROVER_QUEUE)")
        return OK
    console.print(jobs_table(active, fs.current_window(), fs.cap()))
    console.print(tenants_table(active, settings, shared.limiter))
    if settings.pooled:  # what the jobs' calls can go out on
        from drover.orchestrator.ops.stats import print_keys
        print_keys(console, shared)
    return OK


def _print_finished(shared: Any, limit: int) -> None:
    """The latest finished jobs of the results store (a job Redis has dropped is there)."""
    from drover.errors import ResultsStoreError

    if shared.results is None:
        raise Refused("drover jobs --finished reads the results store: set DROVER_RESULTS_URL "
                      "(docs/results-store.md)", code=2)
    try:
        rows = shared.results.jobs(limit)
    except ResultsStoreError as error:
        raise Refused(str(error), code=UNREACHABLE) from None
    table = Table(title=f"finished jobs (results store {shared.results.where})")
    # A job id is what the reader copies into `drover result`: never cut or wrapped.
    table.add_column("job", no_wrap=True, min_width=32)
    for column in ("status", "sub-agents", "ok", "failed", "finished (UTC)"):
        table.add_column(column)
    for row in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(row["finished_at"]))
        table.add_row(row["job_id"], row["status"], str(row["n"]),
                      str(row["counts"].get("ok", 0)), str(row["counts"].get("failed", 0)), when)
    console.print(table)


def _results_schema(args: argparse.Namespace) -> int:
    from drover.workers.jobs.results_db import SCHEMA_SQL

    print(SCHEMA_SQL, end="")
    return OK


def _keys(args: argparse.Namespace) -> int:
    settings = _settings()
    _need_services(settings)
    from drover.orchestrator.ops.stats import print_keys

    shared = _shared(settings)
    limiter = shared.limiter
    known = {k.alias for k in settings.keys}
    if args.action == "list":
        if not known and not limiter.disabled_keys():
            console.print("no pool of keys (DROVER_KEYS is not set): the one key is "
                          f"DROVER_KEY_ALIAS={settings.key_alias}", markup=False)
            return OK
        print_keys(console, shared)
        return OK
    if not args.alias:
        raise Refused(f"drover keys {args.action} needs the key's ALIAS", code=2)
    if known and args.alias not in known and args.action == "disable":
        raise Refused(f"no key {args.alias!r} in DROVER_KEYS (aliases: "
                      f"{', '.join(sorted(known))})", code=2)
    if args.action == "enable":
        if limiter.enable_key(args.alias):
            console.print(f"key {args.alias} enabled: every worker's next call may use it",
                          markup=False)
            return OK
        console.print(f"key {args.alias} was not disabled", markup=False)
        return NOT_ALL_OK
    if limiter.disable_key(args.alias, for_s=args.for_s, why="disabled by `drover keys`"):
        console.print(f"key {args.alias} disabled fleet-wide", markup=False)
        return OK
    console.print(f"key {args.alias} was disabled already", markup=False)
    return NOT_ALL_OK


# --- the parser ----------------------------------------------------------------------------

class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults after each option's help, descriptions and epilogs as written."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30, width=100)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False) or not action.option_strings:
            return action.help  # a flag, or nothing to show
        return super()._get_help_string(action)


def _wrap(text: str) -> str:
    return "\n\n".join(textwrap.fill(p, 96) for p in text.split("\n\n"))


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="drover", formatter_class=_Formatter,
        description=_wrap("Fan out LLM sub-agents on Celery + Redis inside one global rate "
                          "limit. Settings come from DROVER_* environment variables (or a "
                          ".env file); `drover COMMAND --help` explains each command."),
        epilog=_wrap("Exit status: 0 done and every sub-agent ok; 1 the job ended with "
                     "failed or cancelled sub-agents, or failed; 2 usage or settings error; "
                     "3 Redis or the broker does not answer; 4 (result) not finished yet."))
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, summary: str, description: str, epilog: str | None = None
            ) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary, formatter_class=_Formatter,
                              description=_wrap(description),
                              epilog=epilog if epilog is None or "\n  " in epilog
                              else _wrap(epilog))

    demo = add("demo", "run a 40-sub-agent job against the simulator, starting what is missing",
               "Run the whole product on this machine: a Redis (the one at DROVER_REDIS_URL "
               "if it answers, else a private redis-server on a free port, else fakeredis), "
               "the bundled API simulator and an in-process worker pool; then a job that "
               "plans sub-agents from a goal, lets them call offline tools and synthesises "
               "their findings, all under one global limit. Everything it started is stopped "
               "at the end; the demo's keys in a Redis it did not start are deleted at the "
               "end (--keep keeps them for an hour).",
               "Exit status: 0 every sub-agent ok; 1 some were not; 2 bad option or missing "
               "extra; 3 (--on-services) Redis or the broker does not answer.")
    demo.add_argument("--subagents", type=int, default=40, help="sub-agents to plan")
    demo.add_argument("--concurrency", type=int, default=16, help="worker threads")
    demo.add_argument("--rpm", type=int, default=300,
                      help="the simulator's (and the limiter's) requests per minute")
    demo.add_argument("--plot", default="drover-demo-usage.png", metavar="FILE.png",
                      help="where to write the usage plot")
    demo.add_argument("--no-plot", action="store_true", help="write no plot")
    demo.add_argument("--batch", action="store_true",
                      help="run every sub-agent turn through the Message Batches API "
                           "(JobSpec.delivery='batch'): half the price, slower turns")
    demo.add_argument("--keep", action="store_true",
                      help="keep the demo's keys (an hour) to look at them with drover stats")
    demo.add_argument("--on-services", action="store_true",
                      help="start nothing: submit the demo job to the Redis, workers and API "
                      "of the DROVER_* settings (as docker-compose's orchestrator does)")
    demo.set_defaults(fn=_demo)

    for name, fn, text in (
        ("sim", _sim, "run the Anthropic-compatible simulator (drover sim --help)"),
        ("worker", _worker, "start a Celery worker (drover worker --help; other options go "
                            "to celery worker)"),
        ("flower", _flower, "start Flower on drover's broker, loopback only without a "
                            "password (drover flower --help)"),
    ):
        cmd = sub.add_parser(name, help=text, add_help=False)
        cmd.add_argument("rest", nargs=argparse.REMAINDER)
        cmd.set_defaults(fn=fn)

    submit = add("submit", "submit a job spec (a JSON file, or - for stdin)",
                 "Validate a job spec and enqueue it: prints the job id at once (the job "
                 "runs on the workers; nothing is enqueued when the spec or a setting is "
                 "wrong). With --wait, follow it to the end and print the result table.",
                 spec_format())
    submit.add_argument("spec", metavar="SPEC", help="a JSON file with the JobSpec, or - "
                        "for stdin")
    submit.add_argument("--wait", action="store_true", help="wait for the job and print "
                        "the result")
    submit.set_defaults(fn=_submit)

    estimate = add("estimate", "what a job spec will cost and take, before it runs",
                   "Estimate a job spec's LLM calls, tokens, cost (at DROVER_PRICES over the "
                   "bundled price table) and duration at the key's limits, expected and worst "
                   "case, without sending anything. Expected: one call per sub-agent (two "
                   "with tools), answers of --mean-output tokens; worst case: every sub-agent "
                   "uses max_turns, every answer max_tokens, a full-size tool result a turn. "
                   "docs/cost.md explains the figures.",
                   "Exit status: 0; 2 a bad spec or setting, or a spec it cannot estimate.")
    estimate.add_argument("spec", metavar="SPEC", help="a JSON file with the JobSpec, or - "
                          "for stdin")
    estimate.add_argument("--mean-output", type=int, default=None, metavar="TOKENS",
                          help="expected answer length (default: half of max_tokens)")
    estimate.set_defaults(fn=_estimate)

    job_help = "the job id that drover submit printed"
    watch = add("watch", "follow a job live", "Show a progress bar and each sub-agent's "
                "record as it finishes, from any host that reaches the Redis.",
                "Exit status: 0 done, every sub-agent ok; 1 otherwise; 2 unknown job; 3 "
                "Redis does not answer.")
    watch.add_argument("job", metavar="JOB", help=job_help)
    watch.set_defaults(fn=_watch)

    result = add("result", "print a finished job's result",
                 "Print a finished job's result table (or its JSON), or its progress while it "
                 "runs.", "Exit status: 0 done, every sub-agent ok; 1 it ended otherwise; 2 "
                 "unknown job; 3 Redis does not answer; 4 not finished yet.")
    result.add_argument("job", metavar="JOB", help=job_help)
    result.add_argument("--json", action="store_true", help="print the JobResult as JSON")
    result.set_defaults(fn=_result)

    retry = add("retry", "re-run a finished job's sub-agents that did not end ok",
                "Run a finished job's sub-agents that did not end ok (failed, budget_exceeded, "
                "cancelled) again, as a continuation of the same job: the same id, their "
                "records replaced, the join run again once they are in. Sub-agents that "
                "succeeded are never sent again (nor paid for again). For a job that stopped "
                "on the provider's spend limit, raise the limit first (docs/cost.md).",
                "Exit status: 0 sent again, or nothing to retry (with --wait: done, every "
                "sub-agent ok); 1 (--wait) some still did not end ok; 2 unknown job, or one "
                "still running; 3 Redis or the broker does not answer.")
    retry.add_argument("job", metavar="JOB", help=job_help)
    retry.add_argument("--wait", action="store_true", help="wait for the job and print the "
                       "result")
    retry.set_defaults(fn=_retry)

    cancel = add("cancel", "cancel a job on every host",
                 "Cancel a job everywhere: running calls are aborted, queued sub-agents end "
                 "as cancelled without calling the API, finished results are kept.",
                 "Exit status: 0 cancelling; 1 the job had already ended; 2 unknown job; 3 "
                 "Redis does not answer.")
    cancel.add_argument("job", metavar="JOB", help=job_help)
    cancel.add_argument("--reason", default="cancelled", help="recorded on each cancelled "
                        "sub-agent")
    cancel.set_defaults(fn=_cancel)

    stats = add("stats", "per-scope use of the limits over the last minute",
                "Read the limiter's per-second counters in Redis (every worker on every host "
                "writes them) and print, per scope, requests and tokens in the last 60 s and "
                "the busiest 60 s against each limit, then waits, the failed calls by kind "
                "(429, 529, 5xx, 4xx, connection: telemetry's totals), leases and "
                "cooldowns, then per model scope the prompt cache's reads and writes in the "
                "window and why the answers that used no cache did not (a shared prefix "
                "below the model's minimum cacheable length). Input tokens are counted as "
                "the provider's limit counts them: uncached input plus cache writes (plus "
                "cache reads where they count), over every call (planning, sub-agents, "
                "synthesis).",
                "Exit status: 0; 2 bad option or missing extra (--plot needs matplotlib, "
                "drover[demo]); 3 Redis does not answer.")
    stats.add_argument("--plot", metavar="FILE.png", default=None,
                       help="also draw usage over time into this file")
    stats.set_defaults(fn=_stats)

    metrics = add("metrics", "serve the fleet's Prometheus metrics from Redis",
                  "Serve one Prometheus scrape target for the whole fleet: the counters every "
                  "worker writes into Redis, with the limiter's and the job store's state.",
                  "Exit status: 2 bad option or setting, or the port is taken; 3 Redis does not "
                  "answer.")
    _listen_options(metrics, 9808)
    metrics.set_defaults(fn=_metrics)

    gateway = add("gateway", "the provider's HTTP API inside the fleet's limits, for any "
                  "language or tool",
                  "Serve the provider's own API (POST /v1/messages and "
                  "/v1/messages/count_tokens; POST /v1/chat/completions with "
                  "DROVER_PROVIDER=openai) to callers with a key of DROVER_GATEWAY_KEYS: each "
                  "call takes its share of the fleet's global limits (waiting in line when "
                  "they are spent), goes out on the provider key, streams back as it arrives "
                  "and counts as its caller's tenant. Run several behind a load balancer: "
                  "they share the limits through Redis. docs/gateway.md.",
                  "Exit status: 0 stopped (SIGTERM, Ctrl-C); 2 bad option or setting (no "
                  "DROVER_GATEWAY_KEYS), or the port is taken; 3 Redis does not answer.")
    _listen_options(gateway, 8090)
    gateway.add_argument("--verbose", action="store_true",
                         help="log one line per request (tenant, path, status, seconds; "
                         "never a body or a key)")
    gateway.set_defaults(fn=_gateway)

    jobs = add("jobs", "active jobs with tenant, priority, progress and share",
               "List the active jobs on DROVER_QUEUE with tenant, priority, progress and their "
               "share of the fleet, then the tenants' shares.",
               "Exit status: 0; 2 bad setting; 3 Redis does not answer.")
    jobs.add_argument("--finished", type=int, default=0, metavar="N",
                      help="also list the N latest finished jobs of the results store "
                      "(DROVER_RESULTS_URL)")
    jobs.set_defaults(fn=_jobs)

    schema = add("results-schema", "print the results store's SQL schema",
                 "Print the SQL that makes the results store's tables (DROVER_RESULTS_URL, "
                 "docs/results-store.md), to run against an existing database by hand: "
                 "`drover results-schema | psql DATABASE`. Workers make it on first use "
                 "otherwise; it is safe to run again.", "Exit status: 0.")
    schema.set_defaults(fn=_results_schema)

    keys = add("keys", "a pool's keys: list them, enable or disable one fleet-wide",
               "List the keys of the pool (DROVER_KEYS) and which are disabled (a 401/403 "
               "disables a key fleet-wide: its calls move to the others), enable a key again "
               "once it is fixed, or disable one by hand.",
               "Exit status: 0 done; 1 nothing to change (already enabled or disabled); 2 "
               "bad option or unknown alias; 3 Redis does not answer.")
    keys.add_argument("action", nargs="?", default="list", choices=["list", "enable", "disable"],
                      help="what to do")
    keys.add_argument("alias", nargs="?", metavar="ALIAS", help="the key's alias")
    keys.add_argument("--for", dest="for_s", type=float, default=0.0, metavar="SECONDS",
                      help="disable: for this long (0: until enabled)")
    keys.set_defaults(fn=_keys)
    return top


# Commands that hand every argument on. argparse's REMAINDER does not take arguments that
# start with "-" when nothing came before them (python/cpython#61252), so these are
# dispatched before argparse sees them.
_PASSTHROUGH = {"sim": _sim, "worker": _worker, "flower": _flower}


def _say(message: str) -> None:
    print(f"drover: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in _PASSTHROUGH:
        args = argparse.Namespace(command=argv[0], rest=argv[1:], fn=_PASSTHROUGH[argv[0]])
    else:
        args = parser().parse_args(argv)  # exits 2 with argparse's message on a usage error
    import redis
    from kombu.exceptions import OperationalError

    try:
        return int(args.fn(args) or 0)
    except Refused as refused:
        _say(str(refused))
        return refused.code
    except SettingsError as error:
        print(str(error), file=sys.stderr, flush=True)  # it names the variables itself
        return USAGE
    except (redis.ConnectionError, redis.TimeoutError, OperationalError) as error:
        # Redis or the broker went away after the first contact (and stayed away through
        # the clients' reconnect attempts).
        _say(f"lost contact with Redis or the broker: {error}. Is it running? "
             "(DROVER_REDIS_URL, DROVER_BROKER_URL)")
        return UNREACHABLE
    except KeyboardInterrupt:
        return INTERRUPTED
