"""drover against what users write today: one workload, the same simulated limits, side by side.

    python -m bench.compare            # the full run (about 10 minutes on 2 cores)
    python -m bench.compare --quick    # 30 sub-agents, 100 for the overhead (a smoke run)

Every contender runs the same 200 sub-agents (`bench/workload.py`: 3 to 8 calls each, varied
prompt and answer sizes) against one simulator process with the same limits, seed and 2%
529s, reset between contenders (fresh buckets, counters and fault draws), one after another:

  (a)  asyncio.gather, no limits
  (b)  asyncio.gather + a semaphore + aiolimiter's requests/min limiter
  (c1) Celery rate_limit = the key's requests/min / 4, on each of 4 workers (prefork)
  (c2) Celery rate_limit = the key's full requests/min, on each of 4 workers (prefork)
  (d)  drover, 4 worker processes

Then drover alone at scale (`bench/overhead.py`). Writes its section of bench/RESULTS.md
(the table, with the command) and bench/compare.png, and prints every figure.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import time
import uuid
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

from bench.contenders import celery_rate_limit, drover, gather_limited, gather_plain
from bench.contenders.common import Outcome, RunContext, SimProcess, delete_prefix
from bench.limit_tracking import DIMS, figures, phases
from bench.workload import FULL, QUICK, Workload

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- bench.compare:begin -->", "<!-- bench.compare:end -->"


Contender = tuple[str, Callable[[RunContext], Outcome]]


def contenders(workload: Workload, workers: int) -> dict[str, Contender]:
    rpm = workload.limits["rpm"]
    return {
        "a": ("asyncio.gather, no limits", gather_plain.run),
        "b": (f"asyncio.gather + Semaphore({workers * 8}) + AsyncLimiter({rpm:g}, 60)",
              gather_limited.run),
        "c1": (f"Celery rate_limit={rpm / workers:g}/m (RPM/{workers}) x {workers} workers",
               lambda ctx: celery_rate_limit.run(ctx, rpm / workers)),
        "c2": (f"Celery rate_limit={rpm:g}/m (the full RPM) x {workers} workers",
               lambda ctx: celery_rate_limit.run(ctx, rpm)),
        "d": (f"drover, {workers} workers", drover.run),
    }


def run_all(workload: Workload, only: list[str], redis_url: str, prefix: str, workers: int,
            log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Each contender in turn; drover's runs use ``prefix`` (see ``drover.use_prefix``)."""
    table = contenders(workload, workers)
    results: dict[str, dict[str, Any]] = {}
    cap = 3 * workload.lower_bound_s + 30
    try:
        with SimProcess(workload.sim_config()) as sim:
            for key in only:
                name, run = table[key]
                sim.reset()
                ctx = RunContext(workload, sim.url, redis_url, api_key=f"sk-bench-{key}-{prefix}",
                                 prefix=f"{prefix}" if key == "d" else f"{prefix}-{key}",
                                 workers=workers, time_cap_s=cap)
                started = time.monotonic()
                outcome = run(ctx)
                stats = sim.stats()
                fig = figures(workload, stats, outcome)
                fig["name"] = name
                fig["timeline"] = stats["timeline"]
                if key == "d" and stats["accepted"]:
                    fig["phases"] = phases(workload, stats, outcome)
                results[key] = fig
                log(f"({key}) {name}: {summary(fig)} [{time.monotonic() - started:.0f} s]")
    finally:
        for key in only:
            delete_prefix(redis_url, prefix if key == "d" else f"{prefix}-{key}")
    return results


def summary(fig: dict[str, Any]) -> str:
    peaks = ", ".join(f"{d} {f:.0%}" for d, f in fig["peak_fraction"].items())
    errors = f" ({', '.join(f'{k}: {v}' for k, v in fig['errors'].items())})" if fig["lost"] else ""
    return (f"completed {fig['completed']}, lost {fig['lost']}{errors}; provider 429s "
            f"{fig['n429']}, 529s {fig['n529']}; makespan {fig['makespan_s']:.1f} s = "
            f"{fig['ratio']:.2f} x lower bound; peak 60 s vs limit: {peaks}")


# --- the report ----------------------------------------------------------------------------

def _peak(fig: dict[str, Any], dim: str) -> str:
    return f"{fig['peaks'][dim]:,} ({fig['peak_fraction'][dim]:.0%})"


def markdown(workload: Workload, results: dict[str, dict[str, Any]],
             overhead: dict[str, Any] | None, command: str, wall_s: float) -> str:
    limits = workload.limits
    d = workload.demand
    lines = [
        BEGIN,
        "## drover against the usual alternatives",
        "",
        f"Command: `{command}` ({date.today().isoformat()}, {wall_s / 60:.1f} min wall on "
        "this 2-core machine, shared with other jobs).",
        "",
        f"Workload: {workload.subagents} sub-agents, {d.requests:,} LLM calls (3 to 8 each), "
        f"{d.input_tokens:,} input and {d.output_tokens:,} output tokens. Limits (the "
        f"simulator's and drover's): {limits['rpm']:,.0f} requests, {limits['itpm']:,.0f} input "
        f"and {limits['otpm']:,.0f} output tokens per minute, enforced over 1 s buckets; 2% of "
        f"requests answered 529; latency mean {workload.latency_mean_s} s, p95 "
        f"{workload.latency_p95_s} s. Lower bound (demand / rate - burst, largest dimension: "
        f"{workload.binding}): **{workload.lower_bound_s:.1f} s**.",
        "",
        "| contender | completed / lost | 429s | 529s | makespan | x lower bound "
        "| peak requests / 60 s | peak input tokens / 60 s | peak output tokens / 60 s |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| limit | | | | | | {limits['rpm']:,.0f} | {limits['itpm']:,.0f} "
        f"| {limits['otpm']:,.0f} |",
    ]
    for key, fig in results.items():
        name = f"**({key}) {fig['name']}**" if key == "d" else f"({key}) {fig['name']}"
        dagger = " \\*" if fig["lost"] else ""
        lines.append(
            f"| {name} | {fig['completed']} / {fig['lost']} | {fig['n429']:,} | {fig['n529']} "
            f"| {fig['makespan_s']:.1f} s | {fig['ratio']:.2f}{dagger} | {_peak(fig, 'rpm')} "
            f"| {_peak(fig, 'itpm')} | {_peak(fig, 'otpm')} |")
    lines += ["", "\\* lost sub-agents: the work they did not do is not in the makespan. "
              "Peaks are the most the provider accepted in any 60 s window, as a share of the "
              "limit (a run shorter than a minute fits in one window).",
              "", "Lost sub-agents died of: " + ("; ".join(
        f"({k}) " + ", ".join(f"{e} x{n}" for e, n in fig["errors"].items())
        for k, fig in results.items() if fig["lost"]) or "nothing (none lost)") + "."]
    if "d" in results and "phases" in results["d"]:
        ph = results["d"]["phases"]
        lines += ["", f"drover's makespan taken apart (`bench/limit_tracking.py`): first "
                  f"request {ph['start_s']:.1f} s after submit, {ph['saturated_s']:.0f} s at "
                  f">= 80% of the {workload.binding} limit (mean {ph['steady_utilisation']:.1%})"
                  f", a tail of {ph['tail_s']:.1f} s while the last sub-agents finish their "
                  f"remaining calls, join {ph['join_s']:.1f} s."]
    if overhead:
        lines += ["", overhead_markdown(overhead)]
    lines += ["", f"![requests and tokens per second per contender]({PLOT_NAME})", "", END]
    return "\n".join(lines)


def overhead_markdown(o: dict[str, Any]) -> str:
    return "\n".join([
        f"Scale (`bench/overhead.py`, run as part of the command above): {o['n']:,} one-call "
        f"sub-agents on {o['workers']} worker processes x {o['concurrency']} threads, the "
        "simulator without limits or latency; the baselines are bare Celery chords of as many "
        "tasks with drover's Celery settings (JSON, late acks, prefetch 1, Redis), once of "
        "no-op tasks and once of tasks that each make the same one call with the plain sync "
        "SDK. Per sub-agent = wall time from sending the chord to the stored join result / N.",
        "",
        "| | wall | per sub-agent | drover's ratio to it | worker CPU per sub-agent |",
        "|---|---|---|---|---|",
        f"| bare chord, no-op tasks | {o['bare_s']:.1f} s | {o['bare_per_ms']:.2f} ms "
        f"| **{o['ratio']:.2f}** | {o['bare_cpu_ms']:.2f} ms |",
        f"| bare chord, one SDK call per task | {o['call_s']:.1f} s | {o['call_per_ms']:.2f} ms "
        f"| **{o['call_ratio']:.2f}** | {o['call_cpu_ms']:.2f} ms |",
        f"| drover job | {o['drover_s']:.1f} s | {o['drover_per_ms']:.2f} ms | 1 "
        f"| {o['drover_cpu_ms']:.2f} ms |",
        "",
        f"drover: {o['drover_ok']:,} ok of {o['n']:,}; peak RSS of a drover worker process "
        f"{o['drover_rss_mb']:.0f} MB (a bare chord worker, which imports the SDK too: "
        f"{o['bare_rss_mb']:.0f} MB).",
    ])


PLOT_NAME = "compare.png"


def plot(workload: Workload, results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dim = workload.binding
    column = DIMS[dim][2]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for key, res in results.items():
        rows = res["timeline"]
        if not rows:
            continue
        last = rows[-1]["t"]
        per_s = [0.0] * (last + 1)
        n429 = [0] * (last + 1)
        for row in rows:
            per_s[row["t"]] = row[column]
            n429[row["t"]] = row["n429"]
        smooth = [sum(per_s[max(0, t - 2):t + 1]) / len(per_s[max(0, t - 2):t + 1])
                  for t in range(len(per_s))]
        label = f"({key}) {res['name']}: {res['ratio']:.2f}x, lost {res['lost']}"
        width = 2.5 if key == "d" else 1.2
        top.plot(range(len(smooth)), smooth, label=label, linewidth=width)
        cumulative, total = [], 0
        for count in n429:
            total += count
            cumulative.append(total)
        bottom.plot(range(len(cumulative)), cumulative, label=f"({key})", linewidth=width)
    top.axhline(workload.limits[dim] / 60, color="black", linestyle="--", linewidth=1,
                label=f"limit ({workload.limits[dim]:,.0f}/min)")
    top.axvline(workload.lower_bound_s, color="grey", linestyle=":", linewidth=1,
                label=f"lower bound {workload.lower_bound_s:.0f} s")
    top.set_ylabel(f"{column.replace('_', ' ')} accepted / s (3 s mean)")
    top.set_title(f"{workload.subagents} sub-agents against the same simulated limits")
    top.legend(fontsize=7, loc="upper right")
    bottom.set_ylabel("429s from the provider (cumulative)")
    bottom.set_xlabel("seconds since the contender's first request")
    bottom.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_section(path: Path, section: str) -> None:
    """Replace this command's section of RESULTS.md, keeping everything else."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="30 sub-agents, and 100 on 2 workers for the overhead (a smoke "
                             "run); writes nothing unless --out/--plot are given")
    parser.add_argument("--only", default="a,b,c1,c2,d",
                        help="contenders to run, comma-separated (default: all)")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None,
                        help="results file (default: bench/RESULTS.md for a full run)")
    parser.add_argument("--plot", type=Path, default=None,
                        help=f"plot file (default: bench/{PLOT_NAME} for a full run)")
    parser.add_argument("--redis-url", default=None,
                        help="default: DROVER_REDIS_URL, else 127.0.0.1:6379, else a private "
                             "redis-server")
    args = parser.parse_args(argv)
    only = [k.strip() for k in args.only.split(",") if k.strip()]
    workload = QUICK if args.quick else FULL
    unknown = set(only) - set(contenders(workload, args.workers))
    if unknown:
        parser.error(f"unknown contender(s) {sorted(unknown)}; choose from a, b, c1, c2, d")
    out = args.out or (None if args.quick else HERE / "RESULTS.md")
    plot_path = args.plot or (None if args.quick else HERE / PLOT_NAME)
    command = "python -m bench.compare " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))

    from drover.orchestrator.ops.services import ensure_redis

    service = ensure_redis(args.redis_url or os.environ.get("DROVER_REDIS_URL",
                                                             "redis://127.0.0.1:6379/0"))
    started = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - started:6.0f} s] {line}", flush=True)

    try:
        d = workload.demand
        log(f"workload: {workload.subagents} sub-agents, {d.requests} calls, {d.input_tokens:,} "
            f"input / {d.output_tokens:,} output tokens; limits {workload.limits}; lower bound "
            f"{workload.lower_bound_s:.1f} s ({workload.binding})")
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        drover.use_prefix(service.url, prefix)  # before drover's Celery app is imported
        results = run_all(workload, only, service.url, prefix, args.workers, log)
        overhead = None
        if not args.skip_overhead:
            from bench import overhead as scale

            overhead = scale.measure(service.url, prefix, n=100 if args.quick else 2000,
                                     workers=2 if args.quick else 8, log=log)
            log(scale.describe(overhead))
    finally:
        service.close()
    wall = time.monotonic() - started
    report = markdown(workload, results, overhead, command.strip(), wall)
    if out is not None:
        write_section(out, report)
        log(f"wrote {out}")
    if plot_path is not None:
        plot(workload, results, plot_path)
        log(f"wrote {plot_path}")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
