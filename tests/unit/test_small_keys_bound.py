"""bench.small_keys' lower bound (issue 53, item 3): the ideal in-order schedule it replays is
one the simulator's own buckets admit, call by call, and none of its sends could go earlier.
So the bound is neither above what the limits allow in the job's order (every send
admitted) nor below it (each send at the first instant it is admitted)."""

from __future__ import annotations

import bench.small_keys as sk
from drover.simulator import SimConfig
from drover.simulator.buckets import KeyBuckets

# bench.small_keys --mix's calls as the simulator counts them: blocks of ten that the
# requests, the input (prompts larger than the 667-token bucket) and the output (answers
# larger than the 200-token bucket) bind in turn.
KINDS = {0: (26, 100), 1: (927, 100), 2: (26, 320)}
MIX = [KINDS[(i // sk.BLOCK) % 3] for i in range(60)]


def _admitted(calls: list[tuple[int, int]], sends: list[float], early_s: float = 0.0,
              early: int | None = None) -> list[bool]:
    """Each call sent at its instant (call ``early``'s ``early_s`` sooner) into the
    simulator's buckets, its answer's output debited a mean latency later: admitted?"""
    buckets = KeyBuckets(SimConfig(rpm=sk.RPM, itpm=sk.ITPM, otpm=sk.OTPM,
                                   burst_s=sk.BURST_S), 0.0)
    events = sorted([(t - (early_s if i == early else 0.0), 1, i) for i, t in enumerate(sends)]
                    + [(t + sk.LATENCY_S, 0, i) for i, t in enumerate(sends)])
    admitted: list[bool] = [False] * len(calls)
    for at, kind, i in events:
        n_in, n_out = calls[i]
        if kind == 0:  # an answer's output, as it is generated
            buckets.settle_output(n_out, 600, at)
        else:
            admitted[i] = buckets.try_admit(n_in, 600, at) is None
            if i == early:
                return admitted[:i + 1]
    return admitted


def test_the_replayed_schedule_is_admitted_and_no_send_of_it_could_go_earlier() -> None:
    sends: list[float] = []
    bound = sk._bound_replay(MIX, sends=sends)
    # Each a microsecond later than the last (the float arithmetic of a refill), all
    # admitted; any one of them 10 ms sooner, refused.
    later = [t + 1e-6 * (i + 1) for i, t in enumerate(sends)]
    assert all(_admitted(MIX, later))
    for i in range(1, len(MIX)):
        assert not _admitted(MIX, later, early_s=0.01, early=i)[-1], i
    assert bound == sends[-1] + sk.LATENCY_S


def test_the_blocks_formula_undercounts_what_the_limits_allow_in_order() -> None:
    """Every call takes a request, and a bucket of one request holds any two calls 1 s
    apart, across a block's edge too: a block of ten calls that the requests bind lasts 10 s
    up to the next block's first call, where the formula counted 9 (10, less a burst)."""
    sends: list[float] = []
    bound = sk._bound_replay(MIX, sends=sends)

    class Usage:
        def __init__(self, n_in: int, n_out: int) -> None:
            self.calls, self.input_tokens, self.output_tokens = 1, n_in, n_out

    class Record:
        def __init__(self, index: int, call: tuple[int, int]) -> None:
            self.index, self.usage = index, Usage(*call)

    formula = sk._bound_blocks([Record(i, c) for i, c in enumerate(MIX)])
    assert sends[sk.BLOCK] - sends[0] == 10.0  # the first block (requests): 10 s, not 9
    assert bound > formula + 2  # 76.6 s against 73.8 s
    # A job the requests alone bind: 59 s of one call a second, then the last answer.
    assert abs(sk._bound_replay([(26, 100)] * 60) - (59 + sk.LATENCY_S)) < 1e-6
