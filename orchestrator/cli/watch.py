"""Following a job live: a progress bar fed by the job's result stream."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from drover.orchestrator.client.jobs import JobHandle
from drover.orchestrator.ops.shares import active_jobs
from drover.workers.fairshare import FairShare
from drover.workers.jobs.records import JobResult, Usage

# Off a terminal (a pipe, a log file, CI) rich draws no bar: a line this often instead.
PLAIN_EVERY_S = 5.0


def progress_line(handle: JobHandle, started: float) -> str:
    """``progress: 12/30 finished (ok=11 failed=1), 18 pending (3 generating), 42 s``: a
    sub-agent is generating while its answer streams in."""
    counts = handle.progress()
    generating = handle.generating() if counts["pending"] else 0
    finished = counts["total"] - counts["pending"]
    ended = " ".join(f"{k}={v}" for k, v in counts.items()
                     if k not in ("total", "pending") and v)
    return (f"progress: {finished}/{counts['total']} finished" + (f" ({ended})" if ended else "")
            + f", {counts['pending']} pending"
            + (f" ({generating} generating)" if generating else "")
            + f", {time.monotonic() - started:.0f} s")


@contextmanager
def _plain_progress(handle: JobHandle, console: Console) -> Iterator[None]:
    """Print a progress line now and every PLAIN_EVERY_S until the block ends."""
    if console.is_terminal:
        yield
        return
    stop, started = threading.Event(), time.monotonic()

    def lines() -> None:
        while True:
            try:
                console.print(progress_line(handle, started), highlight=False)
            except Exception:  # Redis away for a moment: the next line will say
                pass
            if stop.wait(PLAIN_EVERY_S):
                return

    printer = threading.Thread(target=lines, name="drover-watch-lines", daemon=True)
    printer.start()
    try:
        yield
    finally:
        stop.set()
        printer.join(timeout=5)


def dollars(usage: Usage) -> str:
    """A usage's cost as a short cell: ``$0.0123``, ``unpriced``, or ``$0.0123 + 2 unpriced``
    (calls of a model without a price are never shown as $0)."""
    if usage.cost_usd is None:
        return "unpriced"
    text = f"${usage.cost_usd:,.4f}"
    return text + (f" + {usage.unpriced_calls} unpriced" if usage.unpriced_calls else "")


def usage_lines(usage: Usage) -> list[str]:
    """What a job used, as ``watch`` and ``result`` print it: the answered calls' tokens, the
    calls sent and never answered (billed; their estimate), the batch-rate part and the cost."""
    lines = [f"usage: {usage.calls} answered calls, {usage.input_tokens:,} input, "
             f"{usage.output_tokens:,} output, {usage.cache_creation_input_tokens:,} cache "
             f"write, {usage.cache_read_input_tokens:,} cache read tokens"]
    if usage.unanswered_calls:
        lines.append(f"unanswered: {usage.unanswered_calls} calls sent whose answer never came "
                     f"back (billed by the provider): about {usage.unanswered_input_tokens:,} "
                     f"input and up to {usage.unanswered_output_tokens:,} output tokens "
                     "(their reservations)")
    if usage.batch_calls:
        lines.append(f"by Message Batch: {usage.batch_calls} of {usage.calls} calls, "
                     f"{usage.batch_tokens:,} tokens billed at the batch rate (50%)")
    if usage.cost_usd is None:
        lines.append(f"cost: unpriced ({usage.unpriced_calls} calls of a model without a "
                     "price: set its prices in DROVER_PRICES, docs/cost.md)")
    elif usage.sent_calls:
        unpriced = (f", and {usage.unpriced_calls} calls of a model without a price "
                    "(DROVER_PRICES)" if usage.unpriced_calls else "")
        lines.append(f"cost: ${usage.cost_usd:,.4f} at list prices (DROVER_PRICES over the "
                     f"bundled table; unanswered calls at their estimate){unpriced}")
    return lines


def follow(handle: JobHandle, console: Console, *, show_records: bool = False) -> JobResult:
    """Show progress until the job's JobResult is stored, and return it."""
    with console.status("planning the goal into sub-agents..."):
        while handle.status == "planning":
            time.sleep(0.1)
    total = handle.progress()["total"]
    console.print(f"{total} sub-agents")
    with _plain_progress(handle, console):
        return _follow(handle, console, total, show_records)


def _follow(handle: JobHandle, console: Console, total: int, show_records: bool) -> JobResult:
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(),
               MofNCompleteColumn(), TextColumn("{task.fields[status]}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("sub-agents", total=total, status="")
        counts: dict[str, int] = {}
        share, looked = "", 0.0
        fs = handle.shared.fairshare()
        for record in handle.as_completed():
            counts[record.status] = counts.get(record.status, 0) + 1
            if time.monotonic() - looked > 1.0:  # one read of the window per second
                share, looked = _share(handle, fs), time.monotonic()
            progress.update(bar, advance=1, status=" ".join(
                f"{k}={v}" for k, v in sorted(counts.items())) + share)
            if show_records:
                text = record.error if record.error else record.summary
                batch = (f" batch={record.usage.batch_calls}" if record.usage.batch_calls
                         else "")
                if record.usage.unanswered_calls:
                    batch += f" unanswered={record.usage.unanswered_calls}"
                progress.console.print(f"#{record.index} {record.status} "
                                       f"calls={record.usage.calls}{batch} "
                                       f"cost={dollars(record.usage)} {(text or '')[:70]}",
                                       markup=False)
        progress.update(bar, description="joining")
        result = handle.wait()
        progress.update(bar, description=result.status)
    return result


def _share(handle: JobHandle, fs: FairShare) -> str:
    """The job's part of the fair-share window, its backlog and its turn ('' once all out)."""
    for a in active_jobs(handle.settings, fs):
        if a.share.job_id == handle.id:
            turn = f" due={a.due:.0%} next#{a.position}" if a.share.waiting else ""
            if a.share.waiting and a.last_out_s is not None:
                turn += f" last-out-in={a.last_out_s:.0f}s"
            stalled = " STALLED" if a.stalled else ""
            return (f"  share={a.held:.0%} out={a.share.out} in-line={a.share.waiting}{turn} "
                    f"tenant={a.share.tenant} {a.share.priority}{stalled}")
    return ""


def _batches(handle: JobHandle) -> str:
    """The job's Message Batch counters (requests submitted, and how they ended)."""
    counts = handle.shared.batches.counters(handle.id)
    return " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "none"


def watch(handle: JobHandle, console: Console) -> int:
    result = follow(handle, console, show_records=True)
    console.print(" ".join(f"{k}={v}" for k, v in result.counts.items()),
                  f"wall={result.wall_s:.1f}s", f"status={result.status}")
    for line in usage_lines(result.usage):
        console.print(line, markup=False)
    if result.usage.batch_calls:
        console.print(f"batch requests: {_batches(handle)}")
    return 0 if result.status == "done" else 1
