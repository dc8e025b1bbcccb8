"""``drover stats``: how much of each limit the fleet used, read from the limiter's counters.

The limiter keeps per-scope, per-second counters in Redis (requests at the planned send
second, tokens when a call settles, waits, the prompt cache's figures; see
``drover.workers.limiter``), pruned after ``DROVER_STATS_WINDOW_S``. Calls by outcome (429,
529, 5xx, 4xx, connection errors) are telemetry's ``drover_llm_calls{scope, outcome}``: fleet
totals since its counters began (they expire after DROVER_RESULT_TTL_S without a call), with
no per-second series. Both are in Redis, so this sees every worker on every host, and needs
nothing but the Redis and the key prefix the workers use.

Two views:

- ``print_stats``: per scope, the last 60 s against each limit (and the busiest 60 s of the
  window), waits, calls by outcome, leases in flight, cooldown; the prompt cache's reads and
  writes over the window, and why the answers that used no cache did not.
- ``plot_usage``: requests/min and tokens/min over time, as rolling 60 s sums of the
  per-second counters (what the provider's per-minute limits measure), with the limits
  as horizontal lines; the requests panel's title gives the calls refused by outcome.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rich.console import Console
from rich.table import Table

from drover.config import Settings
from drover.workers.agent.caching import stats_cache_line
from drover.workers.agent.limits import llm_limits, scaled_limits
from drover.workers.limiter import STAT_FIELDS, Limiter, ScopeLimits, split_llm_scope
from drover.workers.services import Services
from drover.workers.telemetry import TelemetryReader

__all__ = ["DIMENSIONS", "ScopeUsage", "cache_lines", "collect", "fleet_cost", "plot_usage",
           "print_stats",
           "rolling_sum",
           "safe_url", "scope_usage", "stats_window_s", "usage_figure"]

# (counter in the limiter, ScopeLimits attribute, label); "tokens" is input + output, the
# one tokens bucket of a provider that has one (OpenAI's) instead of the two before it.
DIMENSIONS = (("requests", "rpm", "requests/min"),
              ("input_tokens", "itpm", "input tokens/min"),
              ("output_tokens", "otpm", "output tokens/min"),
              ("tokens", "tpm", "tokens/min"))
# (telemetry's outcome label, column): the failed calls, as drover_llm_calls counts them
OUTCOMES = (("429", "429s"), ("529", "529s"), ("5xx", "5xxs"), ("4xx", "4xxs"),
            ("connection", "conns"))
# Scopes drawn in one plot: more would make every panel unreadable.
MAX_PLOTTED_SCOPES = 6


@dataclass
class ScopeUsage:
    """One scope's counters over the stats window and its limits (per minute, raw)."""

    scope: str
    series: list[dict[str, int]]          # one row per second, oldest first ("t" = epoch s)
    limits: dict[str, float | None]       # the provider's limits: configured, else learned
    targets: dict[str, float | None]      # what the limiter aims at (limits x utilisation)
    leases: int = 0
    cooldown_s: float = 0.0
    fields: tuple[str, ...] = field(default=(*STAT_FIELDS, "tokens"))
    outcomes: dict[str, int] = field(default_factory=dict)  # telemetry's calls by outcome

    def dimensions(self) -> tuple[tuple[str, str, str], ...]:
        """The scope's dimensions: requests and one tokens bucket where it has one, else
        requests, input and output tokens."""
        if self.limits.get("tokens") is not None or self.targets.get("tokens") is not None:
            return DIMENSIONS[0], DIMENSIONS[3]
        return DIMENSIONS[:3]

    def last(self, seconds: int = 60) -> dict[str, int]:
        """Sums over the last ``seconds`` seconds."""
        rows = self.series[-seconds:]
        return {name: sum(row.get(name, 0) for row in rows) for name in self.fields}

    def peak(self, name: str) -> int:
        """The busiest 60 s of the window for one counter."""
        sums = rolling_sum([row.get(name, 0) for row in self.series])
        return max(sums, default=0)

    @property
    def active(self) -> bool:
        return any(row.get(name, 0) for row in self.series for name in self.fields)


def rolling_sum(values: list[int], window: int = 60) -> list[int]:
    """out[i] = sum(values[i - window + 1 .. i]): a per-minute rate at every second."""
    out: list[int] = []
    total = 0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total)
    return out


def stats_window_s(settings: Settings) -> int:
    """How far back the limiter keeps per-second counters (DROVER_STATS_WINDOW_S)."""
    return int(settings.stats_window_s)


def _configured(settings: Settings, scope: str) -> ScopeLimits | None:
    """The limits drover's settings give a scope; None when only the limiter knows them."""
    kind, _, rest = scope.partition(":")
    llm = split_llm_scope(scope)
    if llm is not None:
        alias, model, pooled = llm
        key = next((k for k in settings.keys if k.alias == alias), None) if pooled else None
        if key is not None:  # a pool's key: its own (workspace's) limits
            own = settings.key_limits_for(key, model)
            return None if own is None else scaled_limits(settings, own, max_in_flight=None)
        if settings.limits_for(model) is not None:  # the one key, or a pool's organisation
            return llm_limits(settings, model)
    elif kind == "tool" and rest in settings.tool_rps:
        return ScopeLimits.for_tool(settings.tool_rps[rest])
    return None


def _limits_of(settings: Settings, scope: str, state: dict[str, Any],
               configured: ScopeLimits | None) -> tuple[dict, dict]:
    """(the provider's limits, the limiter's targets) per dimension, per minute.

    The target is what the limiter enforced at its last write (stored with the bucket), so
    it is right even when this process's settings differ from the workers'. The provider's
    figure is a learned ``-limit`` header where there is one, else the target divided by the
    target utilisation that LLM scopes are scaled by.
    """
    limits: dict[str, float | None] = {}
    targets: dict[str, float | None] = {}
    learned = state.get("learned") or {}
    for name, attr, _ in DIMENSIONS:
        dim = state.get(name)
        target = dim["limit_per_min"] if dim else None
        if target is None and configured is not None:
            target = getattr(configured, attr)
        raw: float | None = target
        if target is not None and split_llm_scope(scope) is not None:
            conf = getattr(configured, attr) if configured is not None else None
            raw = learned[attr] if conf is None and learned.get(attr) else (
                target / settings.target_utilization)
        limits[name] = raw
        targets[name] = target
    return limits, targets


def collect(shared: Services, *, window_s: int | None = None) -> list[ScopeUsage]:
    """Every scope the limiter saw within the window, with its per-second counters and
    telemetry's calls by outcome (``shared``: the caller's root's, see docs/architecture.md)."""
    settings = shared.settings
    window = int(window_s or stats_window_s(settings))
    limiter = shared.limiter
    outcomes = call_outcomes(shared)
    usages = [scope_usage(limiter, settings, scope, window) for scope in limiter.scopes()]
    for u in usages:
        u.outcomes = outcomes.get(u.scope, {})
    return usages


def call_outcomes(shared: Services) -> dict[str, dict[str, int]]:
    """scope -> outcome -> calls, from telemetry's drover_llm_calls (fleet totals)."""
    out: dict[str, dict[str, int]] = {}
    reader = TelemetryReader(shared.redis, shared.settings.key_prefix)
    for name, labels, part, value in reader.counters():
        if name == "drover_llm_calls" and part is None and len(labels) == 2:
            out.setdefault(labels[0], {})[labels[1]] = int(value)
    return out


def scope_usage(limiter: Limiter, settings: Settings, scope: str, seconds: int) -> ScopeUsage:
    """One scope's limits, targets, leases, cooldown and its last ``seconds`` of counters."""
    configured = _configured(settings, scope)
    # The bucket remembers the limits the workers used, until it expires when idle;
    # only then do this process's settings stand in for them.
    state = limiter.state(scope)
    if configured is not None and all(state.get(n) is None for n, _, _ in DIMENSIONS):
        state = limiter.state(scope, configured)
    limits, targets = _limits_of(settings, scope, state, configured)
    series = [{**row, "tokens": row.get("input_tokens", 0) + row.get("output_tokens", 0)}
              for row in limiter.usage(scope, seconds)]
    return ScopeUsage(scope=scope, series=series, limits=limits,
                      targets=targets, leases=int(state.get("leases", 0)),
                      cooldown_s=float(state.get("cooldown_s", 0.0)))


# --- the table ------------------------------------------------------------------------------

def _n(value: float) -> str:
    return f"{value:,.0f}"


def _pct(value: int, limit: float | None) -> str:
    return "" if not limit else f"{value / limit:.0%}"


def safe_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def limits_table(usages: list[ScopeUsage], window_s: int) -> Table:
    """Per scope and dimension: the last 60 s and the busiest 60 s against the limit."""
    table = Table(title="use of the limits (per minute)",
                  caption=f"busiest = the highest rolling 60 s sum in the last "
                          f"{window_s // 60} min; window = the sum over those "
                          f"{window_s // 60} min. Every LLM call counts (planning, sub-agents, "
                          "synthesis), at the second it was sent; input tokens as the limit "
                          "counts them: uncached input + cache writes (+ cache reads on models "
                          "where they count)")
    for name, justify in (("scope", "left"), ("", "left"), ("last 60 s", "right"),
                          ("limit", "right"), ("use", "right"), ("busiest", "right"),
                          ("use", "right"), ("window", "right")):
        # Never wrap a cell mid-word: a scope name broken over lines cannot be copied.
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for u in usages:
        last = u.last(60)
        whole = u.last(len(u.series))
        dims = u.dimensions()
        for k, (name, _, label) in enumerate(dims):
            limit = u.limits.get(name)
            peak = u.peak(name)
            table.add_row(u.scope if k == 0 else "", label.removesuffix("/min"),
                          _n(last.get(name, 0)), "-" if limit is None else _n(limit),
                          _pct(last.get(name, 0), limit), _n(peak), _pct(peak, limit),
                          _n(whole.get(name, 0)), end_section=k == len(dims) - 1)
    return table


def events_table(usages: list[ScopeUsage]) -> Table:
    """Per scope: waits (last 60 s, and the whole window), failed calls by outcome (fleet
    totals), leases, cooldown."""
    table = Table(title="waits (last 60 s; whole window in brackets), failed calls and leases",
                  caption="failed calls: telemetry's drover_llm_calls, every call since the "
                          "fleet's counters began")
    for name in ("scope", "waits", "avg wait", *(column for _, column in OUTCOMES),
                 "in flight", "cooldown"):
        table.add_column(name, justify="left" if name == "scope" else "right", no_wrap=True)
    for u in usages:
        last = u.last(60)
        whole = u.last(len(u.series))
        waits = last.get("waits", 0)
        row = [u.scope, f"{waits} ({whole.get('waits', 0)})",
               f"{last.get('wait_ms', 0) / waits / 1000:.2f} s" if waits else "-"]
        row += [str(u.outcomes.get(outcome, 0)) for outcome, _ in OUTCOMES]
        row.append(str(u.leases))
        row.append(f"{u.cooldown_s:.1f} s" if u.cooldown_s > 0 else "-")
        table.add_row(*row)
    return table


def cache_lines(usages: list[ScopeUsage], window_s: int) -> list[str]:
    """Per LLM scope whose calls were answered in the window: the prompt cache's reads and
    writes, and why the answers that used no cache did not (``drover result`` says the same
    of one job)."""
    lines = []
    for u in usages:
        llm = split_llm_scope(u.scope)
        if llm is None:
            continue
        whole = u.last(len(u.series))
        read, written, uncached = (whole.get(n, 0) for n in ("cache_read", "cache_write",
                                                              "uncached"))
        if read or written or uncached:
            lines.append(f"cache {u.scope}, last {window_s // 60} min: " + stats_cache_line(
                llm[1], read, written, uncached, whole.get("short_prefix", 0)))
    return lines


def speed_lines(usages: list[ScopeUsage], window_s: int) -> list[str]:
    """Per LLM scope whose answers streamed in the window: the mean time to first token and
    the output tokens a second after it (gen_ai.server.time_to_first_token and
    time_per_output_token, as the clients saw them)."""
    lines = []
    for u in usages:
        if split_llm_scope(u.scope) is None:
            continue
        whole = u.last(len(u.series))
        streamed = whole.get("streamed", 0)
        if not streamed:
            continue
        gen_s = whole.get("gen_ms", 0) / 1000
        speed = (f"{whole.get('gen_tokens', 0) / gen_s:,.1f} output tokens/s" if gen_s > 0
                 else "output tokens/s: -")
        lines.append(f"speed {u.scope}, last {window_s // 60} min: time to first token "
                     f"{whole.get('ttft_ms', 0) / streamed / 1000:.2f} s (mean of {streamed} "
                     f"answers), {speed} after it")
    return lines


def burst_lines(usages: list[ScopeUsage], settings: Settings) -> list[str]:
    """Why a scope shows many waits at a low use of its limit: the bucket holds only
    DROVER_BURST_SECONDS of refill, so calls sent together beyond it wait their turn."""
    lines = []
    for u in usages:
        last = u.last(60)
        waits, sent = last.get("waits", 0), last.get("requests", 0)
        target = u.targets.get("requests")
        if not target or waits < 5 or sent / target >= 0.5:
            continue
        room = target / 60 * settings.burst_seconds
        lines.append(f"{u.scope}: {waits} waits at {sent / target:.0%} of the request limit: "
                     f"the limiter's bucket holds DROVER_BURST_SECONDS={settings.burst_seconds:g} "
                     f"s of refill (about {room:.1f} requests), so calls that arrive together "
                     "beyond it wait for the refill (the provider, too, enforces its "
                     "per-minute limit over short intervals): pacing, not a shortage")
    return lines


def print_stats(console: Console, shared: Services, plot: Path | None = None) -> int:
    """``drover stats [--plot FILE]``: the table, and the plot when asked for."""
    settings = shared.settings
    usages = collect(shared)
    window = stats_window_s(settings)
    where = f"prefix {settings.key_prefix!r} on {safe_url(settings.redis_url)}"
    if not usages:
        console.print(f"no limiter activity in the last {window} s under "
                      f"{where} (DROVER_KEY_PREFIX and DROVER_REDIS_URL must match the "
                      "workers')")
    else:
        console.print(limits_table(usages, window))
        console.print(events_table(usages))
        for line in (cache_lines(usages, window) + speed_lines(usages, window)
                     + burst_lines(usages, settings)):
            console.print(line, markup=False, highlight=False)
        console.print(f"[dim]{where}; drover aims at {settings.target_utilization:.0%} of "
                      "each limit (DROVER_TARGET_UTILIZATION)[/]")
    _print_unanswered(console, shared)
    _print_cost(console, shared)
    _print_gateway(console, shared)
    print_keys(console, shared)
    _print_shares(console, shared)
    _print_batches(console, shared, usages)
    if plot is not None:
        plot_usage(shared, plot, usages=usages)
        console.print(f"usage plot written to {plot.resolve()}")
    return 0


def print_keys(console: Console, shared: Services) -> None:
    """A pool's keys (DROVER_KEYS): which are disabled, since when, why, until when. Their use
    of their own limits is in the table above (scopes pool/llm:ALIAS:CLASS; the
    organisation's are pool/llm:org:CLASS)."""
    settings = shared.settings
    disabled = shared.limiter.disabled_keys()
    aliases = [k.alias for k in settings.keys] + sorted(set(disabled) - {
        k.alias for k in settings.keys})
    if not aliases:
        return
    for alias in aliases:
        off = disabled.get(alias)
        if off is None:
            console.print(f"key {alias}: enabled", markup=False)
            continue
        since = time.strftime("%H:%M:%S", time.localtime(off["since"]))
        until = ("until `drover keys enable " + alias + "`" if off["until"] is None else
                 "until " + time.strftime("%H:%M:%S", time.localtime(off["until"])))
        console.print(f"key {alias}: DISABLED since {since} ({off['reason']}), {until}",
                      markup=False)
    left = [a for a in aliases if a not in disabled]
    console.print(f"pool: {len(left)} of {len(aliases)} keys enabled", markup=False)


def _print_unanswered(console: Console, shared: Services) -> None:
    """Calls sent whose answer never came back (a cancel or deadline aborted them, a worker
    was lost, a timeout or a cut connection): the provider bills them; their estimate."""
    lost = shared.counters.unanswered()
    for scope, n in sorted(lost.items()):
        since = time.strftime("%H:%M:%S", time.localtime(n.get("since", time.time())))
        console.print(f"{scope}: {int(n.get('calls', 0))} calls sent and never answered since "
                      f"{since} (billed by the provider): about {int(n.get('input_tokens', 0)):,}"
                      f" input and up to {int(n.get('output_tokens', 0)):,} output tokens, "
                      "their reservations", markup=False)


def fleet_cost(shared: Services) -> tuple[dict[tuple[str, str], float], dict[str, int]]:
    """(model, tenant) -> dollars, and model -> unpriced calls, from telemetry's
    drover_cost_usd and drover_unpriced_calls (fleet totals since the counters began)."""
    dollars: dict[tuple[str, str], float] = {}
    unpriced: dict[str, int] = {}
    reader = TelemetryReader(shared.redis, shared.settings.key_prefix)
    for name, labels, part, value in reader.counters():
        if name == "drover_cost_usd" and part is None and len(labels) == 2:
            dollars[(labels[0], labels[1])] = value
        elif name == "drover_unpriced_calls" and part is None and len(labels) == 1:
            unpriced[labels[0]] = int(value)
    return dollars, unpriced


def gateway_use(shared: Services) -> dict[str, dict[str, float]]:
    """tenant -> {outcome or token type: count} of the calls through ``drover gateway``
    (telemetry's drover_gateway_requests and drover_gateway_tokens, fleet totals)."""
    use: dict[str, dict[str, float]] = {}
    reader = TelemetryReader(shared.redis, shared.settings.key_prefix)
    for name, labels, part, value in reader.counters():
        if name in ("drover_gateway_requests", "drover_gateway_tokens") and part is None \
                and len(labels) == 2:
            row = use.setdefault(labels[0], {})
            row[labels[1]] = row.get(labels[1], 0.0) + value
    return use


def _print_gateway(console: Console, shared: Services) -> None:
    """Each tenant's calls through drover gateway: requests by outcome, tokens by type."""
    for tenant, row in sorted(gateway_use(shared).items()):
        outcomes = ", ".join(f"{k} {int(v)}" for k, v in sorted(row.items())
                             if k in ("ok", "429", "4xx", "5xx", "refused", "unavailable",
                                      "disconnected"))
        tokens = ", ".join(f"{k} {int(v):,}" for k, v in sorted(row.items())
                           if k in ("input", "output", "cache_read", "cache_write",
                                    "unanswered_input", "unanswered_output"))
        console.print(f"gateway tenant={tenant}: requests {outcomes or 'none'}; tokens "
                      f"{tokens or 'none'} (since the counters began)", markup=False,
                      highlight=False)


def _print_cost(console: Console, shared: Services) -> None:
    """What the fleet's calls cost at list prices, by model and tenant, and the calls of
    models without a price (never shown as $0)."""
    dollars, unpriced = fleet_cost(shared)
    for (model, tenant), usd in sorted(dollars.items()):
        console.print(f"cost {model} tenant={tenant}: ${usd:,.4f} at list prices",
                      markup=False, highlight=False)
    for model, n in sorted(unpriced.items()):
        console.print(f"cost {model}: unpriced ({n} calls; set its prices in DROVER_PRICES)",
                      markup=False, highlight=False)
    if dollars:
        console.print(f"cost of the fleet's calls: ${sum(dollars.values()):,.4f} (since the "
                      "counters began; prices: DROVER_PRICES over the bundled table of "
                      f"{shared.settings.price_table.date})", markup=False, highlight=False)


def _print_batches(console: Console, shared: Services, usages: list[ScopeUsage]) -> None:
    """Message Batches: what is queued or open now, and the tokens that came back by batch
    (the ``batch:`` scopes above, billed at half the price)."""
    store = shared.batches
    opened = store.open_batches()
    pending = sum(store.pending_state(scope)[0] for scope in store.scopes())
    billed = [u for u in usages if u.scope.startswith("batch:")]
    if not (opened or pending or billed):
        return
    whole = {name: sum(u.last(len(u.series)).get(name, 0) for u in billed)
             for name in ("requests", "input_tokens", "output_tokens")}
    console.print(f"Message Batches: {len(opened)} open "
                  f"({sum(len(b.custom_ids) for b in opened)} requests), {pending} pending; "
                  f"in the window {whole['requests']:,} requests came back by batch with "
                  f"{whole['input_tokens']:,} input and {whole['output_tokens']:,} output "
                  "tokens, billed at the batch rate (50%)")


def _print_shares(console: Console, shared: Services) -> None:
    """Per active job and tenant: its share of the window (so of the limits) and backlog."""
    from drover.orchestrator.ops.shares import active_jobs, jobs_table, tenants_table

    fs = shared.fairshare()
    active = active_jobs(shared.settings, fs)
    if active:
        console.print(jobs_table(active, fs.current_window()))
        console.print(tenants_table(active, shared.settings, shared.limiter))


# --- the plot -------------------------------------------------------------------------------

def _span(usages: list[ScopeUsage]) -> tuple[int, int] | None:
    """First active second to the end of the last minute of activity (or now)."""
    seconds = [row["t"] for u in usages for row in u.series
               if any(row.get(n, 0) for n in u.fields)]
    if not seconds:
        return None
    now = max(u.series[-1]["t"] for u in usages if u.series)
    return min(seconds), min(now, max(seconds) + 60)


def plot_usage(shared: Services, path: Path | str, *,
               usages: list[ScopeUsage] | None = None) -> Path:
    """Draw requests/min and tokens/min over time against the limits into ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and in containers
    import matplotlib.pyplot as plt

    path = Path(path)
    fig = usage_figure(shared.settings, collect(shared) if usages is None else usages)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def usage_figure(settings: Settings, usages: list[ScopeUsage]) -> Any:
    """One row per active scope (LLM scopes first), one panel per limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    active = [u for u in usages if u.active]
    active.sort(key=lambda u: (split_llm_scope(u.scope) is None,
                               -u.last(len(u.series))["requests"]))
    active = active[:MAX_PLOTTED_SCOPES]
    span = _span(active)
    rows = max(1, len(active))
    fig, axes = plt.subplots(rows, 3, figsize=(16, 3.6 * rows), squeeze=False)
    if span is None:
        for ax in axes[0]:
            ax.text(0.5, 0.5, f"no limiter activity under prefix {settings.key_prefix!r}",
                    ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
    else:
        for row_axes, u in zip(axes, active, strict=True):
            _draw_scope(row_axes, u, span)
    fig.suptitle(f"drover: use of the limits per scope, prefix {settings.key_prefix}",
                 fontsize=11)
    fig.tight_layout()
    return fig


def _draw_scope(axes: Any, u: ScopeUsage, span: tuple[int, int]) -> None:
    from matplotlib.ticker import FuncFormatter

    start, end = span
    # Rolling sums need the minute before the span too, so compute over the whole series.
    ts = [row["t"] for row in u.series]
    keep = [i for i, t in enumerate(ts) if start <= t <= end]
    if not keep:
        return
    x = [ts[i] - start for i in keep]
    for ax in axes[len(u.dimensions()):]:  # a scope of one tokens bucket has two panels
        ax.set_axis_off()
    colors = ("tab:blue", "tab:green", "tab:purple")
    for ax, (name, attr, label), color in zip(axes, u.dimensions(), colors, strict=False):
        sums = rolling_sum([row.get(name, 0) for row in u.series])
        y = [sums[i] for i in keep]
        ax.plot(x, y, color=color, label=f"{label} (rolling 60 s)")
        # A run shorter than a minute never fills the 60 s window; the 10 s rate shows
        # whether it ran at the limit all the same.
        short = rolling_sum([row.get(name, 0) for row in u.series], 10)
        ax.plot(x, [short[i] * 6 for i in keep], color=color, alpha=0.35, linewidth=1,
                label="10 s rate x 6")
        _limit_line(ax, u.limits.get(name), u.targets.get(name), color, attr)
        ax.set_title(f"{u.scope}: {label}" + (_refused(u) if name == "requests" else ""),
                     fontsize=9)
        ax.set_xlabel("seconds since the first request")
        ax.set_xlim(0, max(1, end - start))
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")


def _refused(u: ScopeUsage) -> str:
    """The failed calls of a scope, as telemetry counts them: totals, no per-second series,
    so they are told in the title rather than marked at a second."""
    failed = [f"{column} {u.outcomes[o]}" for o, column in OUTCOMES if u.outcomes.get(o)]
    return f" ({', '.join(failed)} in all)" if failed else ""


def _limit_line(ax: Any, limit: float | None, target: float | None, color: str,
                name: str) -> None:
    if limit is None:
        return
    ax.axhline(limit, color=color, linestyle="--", linewidth=1, label=f"{name} limit {limit:,.0f}")
    if target is not None and abs(target - limit) > 1e-9:
        ax.axhline(target, color=color, linestyle=":", linewidth=1,
                   label=f"drover target {target:,.0f}")
