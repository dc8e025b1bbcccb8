"""An Anthropic-compatible Messages API simulator with real rate-limit semantics.

Used by drover's demo, tests and benchmarks; depends only on the stdlib and aiohttp.

    with SimulatorServer(SimConfig(rpm=50, itpm=40_000)) as sim:
        client = anthropic.Anthropic(base_url=sim.url, api_key="sk-test", max_retries=0)
"""

from .cli import main
from .config import SimConfig
from .engine import Engine
from .server import SimulatorServer, make_app
from .tokens import count_text, count_tokens

__all__ = ["Engine", "SimConfig", "SimulatorServer", "count_text", "count_tokens", "main",
           "make_app"]
