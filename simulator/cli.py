"""`python -m drover.simulator`: a flag per SimConfig field, --host, --port; blocks until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from dataclasses import fields

from .config import SimConfig
from .engine import Engine
from .server import make_app, start_runner

_HELP = {
    "provider": "the API it speaks: anthropic (/v1/messages), openai (/v1/chat/completions, "
                "limits --rpm and --tpm), bedrock (Claude on Amazon Bedrock: /model/{id}/invoke, "
                "limits --rpm and --tpm, output counted --output-burndown times) or vertex "
                "(Claude on Google Vertex AI: .../publishers/anthropic/models/{id}:rawPredict)",
    "output_burndown": "bedrock: how many times an output token counts against --tpm",
    "tpm": "openai: tokens per minute per API key (input + max tokens, charged at admission)",
    "retry_after_headers": "openai: what a 429 carries: retry-after (seconds), retry-after-ms "
                           "(ms), both or none",
    "rpm": "requests per minute per API key",
    "itpm": "input tokens per minute per API key",
    "otpm": "output tokens per minute per API key",
    "burst_s": "bucket capacity in seconds of refill",
    "other_share": "fraction of every limit another user of the key takes (0 = none)",
    "other_model": "refill: our buckets refill at (1 - share); draws: the other user sends "
                   "requests of its own from the same full buckets",
    "otpm_mode": "generated: debit output as generated; max_tokens: reserve max_tokens",
    "refuse_oversized": "answer 429 every time to a request larger than a whole minute of a "
                        "limit (else it is admitted once the bucket is full)",
    "overload_rate": "fraction of requests answered 529 overloaded_error",
    "error_5xx_rate": "fraction of requests answered 500 api_error",
    "inject_429_rate": "fraction answered 429 even when the bucket has room",
    "latency_mean_s": "mean latency of a successful answer (lognormal)",
    "latency_p95_s": "95th percentile latency",
    "output_tokens_per_s": "generation speed: output tokens a second (0 = instant)",
    "ttft_s": "time to first token, on top of the latency",
    "output_share_min": "a text answer's length as a share of max_tokens, at least (0: off)",
    "output_share_max": "a text answer's length as a share of max_tokens, at most (0: off)",
    "prices": "JSON, dollars per million tokens by model, e.g. '{\"claude-sonnet-4-6\": "
              "{\"input\": 3, \"output\": 15}}': /_sim/stats' billing is the bill at these",
    "batch_discount": "the fraction of the price a Message Batch result pays",
    "spend_limit_calls": "the organisation's spend limit in paid calls: past it every request "
                         "is refused (429 enforced_spend_limit_reached / insufficient_quota)",
    "key_spend_limit_calls": "JSON, a pool key's (workspace's) spend limit: alias -> paid calls",
}


def build_parser(prog: str = "python -m drover.simulator") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Anthropic-compatible Messages API simulator with real rate limits "
                    "(--provider openai: OpenAI's Chat Completions and its limits).")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080,
                        help="0 picks a free port (default: 8080)")
    defaults = SimConfig()
    for f in fields(SimConfig):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        shown = "unlimited" if default is None else default
        help_text = (_HELP.get(f.name, "") + f" (default: {shown})").strip()
        if isinstance(default, bool):
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=default, help=help_text)
        elif f.name == "otpm_mode":
            parser.add_argument(flag, dest=f.name, choices=["generated", "max_tokens"],
                                default=default, help=help_text)
        elif f.name == "provider":
            parser.add_argument(flag, dest=f.name,
                                choices=["anthropic", "openai", "bedrock", "vertex"],
                                default=default, help=help_text)
        elif f.name == "retry_after_headers":
            parser.add_argument(flag, dest=f.name, choices=["seconds", "ms", "both", "none"],
                                default=default, help=help_text)
        elif f.name == "other_model":
            parser.add_argument(flag, dest=f.name, choices=["refill", "draws"],
                                default=default, help=help_text)
        else:
            # Kept as strings; SimConfig.replaced() coerces and validates ("none" = unlimited).
            parser.add_argument(flag, dest=f.name, default=None, metavar="VALUE",
                                help=help_text)
    return parser


async def _serve(config: SimConfig, host: str, port: int) -> None:
    runner, bound = await start_runner(make_app(engine=Engine(config)), host, port)
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    reach = "<this host's address>" if host in ("0.0.0.0", "") else host
    if config.provider == "openai":
        print(f"simulator (OpenAI Chat Completions) listening on http://{shown}:{bound} (it "
              f"takes any API key: the OpenAI SDK with "
              f"OPENAI_BASE_URL=http://{reach}:{bound}/v1 OPENAI_API_KEY=sk-sim)", flush=True)
    elif config.provider == "bedrock":
        print(f"simulator (Claude on Amazon Bedrock) listening on http://{shown}:{bound} (it "
              "takes any Bedrock API key or AWS access key: the SDK's AnthropicBedrock with "
              f"base_url=http://{reach}:{bound})", flush=True)
    elif config.provider == "vertex":
        print(f"simulator (Claude on Google Vertex AI) listening on http://{shown}:{bound} (it "
              "takes any access token: the SDK's AnthropicVertex with "
              f"base_url=http://{reach}:{bound}/v1)", flush=True)
    else:
        print(f"simulator listening on http://{shown}:{bound} (it takes any API key: on the "
              f"workers, DROVER_ANTHROPIC_BASE_URL=http://{reach}:{bound} "
              "ANTHROPIC_API_KEY=sk-sim)", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass  # not on this platform/thread: Ctrl-C still arrives as KeyboardInterrupt
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None, prog: str = "python -m drover.simulator") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    changes = {f.name: getattr(args, f.name) for f in fields(SimConfig)
               if getattr(args, f.name) is not None}
    try:
        config = SimConfig().replaced(**changes)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        asyncio.run(_serve(config, args.host, args.port))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        print(f"simulator: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2  # like a bad option: the address is the caller's choice
    return 0
