"""The contenders of `python -m bench.compare`, one small module each.

Each exposes ``run(ctx: RunContext) -> Outcome``; (a) to (c) are what users write today,
kept small and idiomatic (the SDK's default retries, max_retries=2); (d) is drover.
"""
