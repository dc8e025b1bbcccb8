"""The ``drover`` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from config import SettingsError

console = Console()
err = Console(stderr=True)


def _demo(args: argparse.Namespace) -> int:
    from orchestrator.demo import DemoConfig, run_demo, run_demo_on_services

    plot = None if args.no_plot else Path(args.plot)
    config = DemoConfig(subagents=args.subagents, concurrency=args.concurrency,
                        rpm=args.rpm, plot=plot)
    if args.on_services:
        return run_demo_on_services(config, console)
    return run_demo(config, console)


def _sim(args: argparse.Namespace) -> int:
    from simulator import main as sim_main

    return sim_main(args.rest)


def _worker(args: argparse.Namespace) -> int:
    from config import get_settings
    from workers.app import app

    settings = get_settings()
    argv = ["worker", "--pool", "threads", "--concurrency", "32", "--queues", settings.queue,
            "--loglevel", "INFO", *args.rest]
    app.worker_main(argv)
    return 0


def _load_spec(path: str) -> object:
    from workers.jobs.spec import JobSpec

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as error:
        raise SystemExit(f"cannot read the job spec {path!r}: {error.strerror}") from None
    try:
        return JobSpec.model_validate_json(text)
    except ValidationError as error:
        lines = [f"the job spec {path!r} is not valid; nothing was enqueued:"]
        for item in error.errors():
            where = ".".join(str(p) for p in item["loc"]) or "(spec)"
            lines.append(f"  {where}: {item['msg'].removeprefix('Value error, ')}")
        raise SystemExit("\n".join(lines)) from None


def _submit(args: argparse.Namespace) -> int:
    from orchestrator.jobs import submit

    spec = _load_spec(args.spec)
    try:
        handle = submit(spec)  # type: ignore[arg-type]
    except ValueError as error:
        raise SystemExit(f"refused, nothing was enqueued: {error}") from None
    console.print(handle.id)
    if args.wait:
        return _print_result(handle.wait())
    return 0


def _handle(job_id: str):  # noqa: ANN202
    from orchestrator.jobs import JobHandle, JobNotFound

    try:
        return JobHandle.attach(job_id)
    except JobNotFound as error:
        raise SystemExit(str(error)) from None


def _print_result(result) -> int:  # noqa: ANN001
    table = Table(title=f"job {result.job_id}: {result.status}"
                  + (f" ({result.reason})" if result.reason else ""))
    for column in ("#", "status", "calls", "in", "out", "attempts", "error / summary"):
        table.add_column(column)
    for r in result.results:
        note = f"{r.status_code or ''} {r.error_type}: {r.error}" if r.error else r.summary
        table.add_row(str(r.index), r.status, str(r.usage.calls), str(r.usage.input_tokens),
                      str(r.usage.output_tokens), str(r.attempts), (note or "")[:80])
    console.print(table)
    console.print(" ".join(f"{k}={v}" for k, v in result.counts.items()),
                  f"wall={result.wall_s:.1f}s")
    if result.synthesis:
        console.print("\n[bold]Synthesis[/]\n" + result.synthesis)
    return 0 if result.status == "done" else 1


def _result(args: argparse.Namespace) -> int:
    handle = _handle(args.job)
    result = handle.result()
    if result is None:
        console.print(f"job {args.job} is {handle.status}: {handle.progress()}")
        return 2
    if args.json:
        console.print_json(result.model_dump_json())
        return 0
    return _print_result(result)


def _cancel(args: argparse.Namespace) -> int:
    handle = _handle(args.job)
    if handle.cancel():
        console.print(f"cancelling job {args.job} on every worker")
        return 0
    console.print(f"job {args.job} had already ended ({handle.status})")
    return 1


def _watch(args: argparse.Namespace) -> int:
    from orchestrator.watch import watch

    return watch(_handle(args.job), console)


def _stats(args: argparse.Namespace) -> int:
    from orchestrator.stats import print_stats

    return print_stats(console, plot=Path(args.plot) if args.plot else None)


def _metrics(args: argparse.Namespace) -> int:
    from orchestrator.metrics import serve

    return serve(args.port, args.addr)


def _jobs(args: argparse.Namespace) -> int:
    from config import get_settings
    from orchestrator.shares import active_jobs, jobs_table, tenants_table
    from workers.jobs.connections import sync_redis
    from workers.jobs.fairshare import FairShare

    settings = get_settings()
    fs = FairShare.from_settings(sync_redis(settings.redis_url), settings)
    active = active_jobs(settings, fs)
    if not active:
        console.print(f"no active jobs on queue {settings.queue!r} (DROVER_QUEUE)")
        return 0
    console.print(jobs_table(active, fs.current_window()))
    console.print(tenants_table(active, settings))
    return 0


def _flower(args: argparse.Namespace) -> int:
    from orchestrator.flower import run_flower

    return run_flower(args.rest)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="drover", description="Fan out LLM sub-agents on Celery + Redis inside one "
        "global rate limit. Settings come from DROVER_* environment variables.")
    sub = top.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run a 40-sub-agent job against the simulator, "
                          "starting whatever is missing")
    demo.add_argument("--subagents", type=int, default=40)
    demo.add_argument("--concurrency", type=int, default=16)
    demo.add_argument("--rpm", type=int, default=300)
    demo.add_argument("--plot", default="drover-demo-usage.png")
    demo.add_argument("--no-plot", action="store_true")
    demo.add_argument("--on-services", action="store_true",
                      help="start nothing: submit the demo job to the Redis, workers and API "
                      "of the DROVER_* settings (as docker-compose's orchestrator does)")
    demo.set_defaults(fn=_demo)

    for name, fn, text in (
        ("sim", _sim, "run the Anthropic-compatible simulator (args: see drover sim --help)"),
        ("worker", _worker, "start a Celery worker (extra args go to celery worker)"),
        ("flower", _flower, "start Flower on this app (extra args go to celery flower)"),
    ):
        cmd = sub.add_parser(name, help=text, add_help=False)
        cmd.add_argument("rest", nargs=argparse.REMAINDER)
        cmd.set_defaults(fn=fn)

    submit = sub.add_parser("submit", help="submit a job spec (JSON file, or - for stdin)")
    submit.add_argument("spec")
    submit.add_argument("--wait", action="store_true", help="wait and print the result")
    submit.set_defaults(fn=_submit)

    for name, fn, text in (("watch", _watch, "follow a job live"),
                           ("result", _result, "print a finished job's result"),
                           ("cancel", _cancel, "cancel a job on every host")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("job")
        if name == "result":
            cmd.add_argument("--json", action="store_true")
        cmd.set_defaults(fn=fn)

    stats = sub.add_parser("stats", help="per-scope use of the limits over the last minute")
    stats.add_argument("--plot", metavar="FILE.png", help="also draw usage over time")
    stats.set_defaults(fn=_stats)

    metrics = sub.add_parser("metrics", help="serve the fleet's Prometheus metrics from Redis")
    metrics.add_argument("--port", type=int, default=9808)
    metrics.add_argument("--addr", default="127.0.0.1",
                         help="address to listen on (0.0.0.0 for every interface)")
    metrics.set_defaults(fn=_metrics)

    jobs = sub.add_parser("jobs", help="active jobs with tenant, priority, progress and share")
    jobs.set_defaults(fn=_jobs)
    return top


# Commands that hand every argument on. argparse's REMAINDER does not take arguments that
# start with "-" when nothing came before them (python/cpython#61252), so these are
# dispatched before argparse sees them.
_PASSTHROUGH = {"sim": _sim, "worker": _worker, "flower": _flower}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in _PASSTHROUGH:
        args = argparse.Namespace(command=argv[0], rest=argv[1:], fn=_PASSTHROUGH[argv[0]])
    else:
        args = parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except SettingsError as error:
        err.print(str(error), markup=False, highlight=False)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
