"""Benchmark: termchat's own overhead, and what speculation gives, on one prompt.

    python -m termchat.bench.overhead [--runs 5] [--max-tokens 200]

Runs one code-rewrite prompt at temperature 0 through (a) vLLM's server
directly (a bare HTTP stream, parsed with nothing but json) and (b)
`termchat ask --json` attached to the same server, with the `local` profile's
speculation and without it. Prints decode tokens/s (first token excluded) for
the four, as medians over alternating runs, and the ratios. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import httpx

from termchat.engine import registry
from termchat.engine.client import SSELines
from termchat.errors import UserError
from termchat.engine.process import ManagedEngine
from termchat.profiles import load_config

CODE_REWRITE = """Rewrite this Python function so that it uses a list comprehension, and keep everything else identical:

def squares_of_evens(numbers):
    result = []
    for number in numbers:
        if number % 2 == 0:
            result.append(number * number)
    return result


def cubes_of_odds(numbers):
    result = []
    for number in numbers:
        if number % 2 == 1:
            result.append(number * number * number)
    return result
"""


def direct(engine, max_tokens: int) -> float:
    """Decode tok/s measured on a bare stream from vLLM, without termchat's client.

    The messages are the ones `termchat ask` sends (system prompt first), so
    both see the same reply."""
    system = [{"role": "system", "content": engine.profile.system_prompt}] if engine.profile.system_prompt else []
    body = {
        "model": engine.model_name,
        "messages": system + [{"role": "user", "content": CODE_REWRITE}],
        "stream": True,
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "return_token_ids": True,
    }
    first = last = None
    tokens = 0
    with httpx.stream("POST", engine.base_url + "/chat/completions", json=body, headers=engine.headers(), timeout=300, trust_env=engine.uses_proxy_settings) as response:
        splitter = SSELines()
        for line in (line for data in response.iter_bytes() for line in splitter.feed(data)):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                n = len(choice.get("token_ids") or [])
                if n:
                    now = time.monotonic()
                    first = first or now
                    last = now
                    tokens += n
    return (tokens - 1) / (last - first)


def via_ask(profile_name: str, config: str | None, max_tokens: int, nospec: bool) -> float:
    cmd = [sys.executable, "-m", "termchat.cli", "ask", "--json", "--no-save", "--profile", profile_name, "--temperature", "0", "--max-tokens", str(max_tokens)]
    if nospec:
        cmd.append("--no-speculation")
    if config:
        cmd += ["--config", config]
    result = subprocess.run(cmd, input=CODE_REWRITE, capture_output=True, text=True, check=True)
    return json.loads(result.stdout)["decode_tokens_per_s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="local")
    parser.add_argument("--config")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args(argv)
    spec_profile = load_config(args.config).get(args.profile)
    rows = {}
    for label, profile in (("speculation", spec_profile), ("no speculation", spec_profile.without_speculation())):
        print(f"starting {profile.name} ...", file=sys.stderr, flush=True)
        engine = ManagedEngine.launch(profile)
        try:
            engine.wait_ready()
            # `termchat ask --profile NAME` attaches to a served engine of that name
            there = registry.write_state(engine)
            if there is not None:
                raise UserError(registry.in_the_way(profile, there))
            direct(engine, args.max_tokens)  # warm-up: the first request after start-up is slow
            a, b = [], []
            for run in range(args.runs):
                a.append(direct(engine, args.max_tokens))
                b.append(via_ask(args.profile, args.config, args.max_tokens, nospec=profile is not spec_profile))
                print(f"  {label} run {run + 1}: direct {a[-1]:.1f}, termchat {b[-1]:.1f} tok/s", file=sys.stderr, flush=True)
            rows[label] = (statistics.median(a), statistics.median(b))
        finally:
            registry.remove_state(profile.name, engine.pid)
            engine.stop()
    print(f"\ndecode tokens/s, median of {args.runs} runs, temperature 0, max {args.max_tokens} tokens, profile {args.profile}")
    print(f"{'':16}{'vLLM direct':>12}{'termchat ask':>14}{'overhead':>10}")
    for label, (a, b) in rows.items():
        print(f"{label:16}{a:12.1f}{b:14.1f}{(a - b) / a:10.1%}")
    (sa, sb), (na, nb) = rows["speculation"], rows["no speculation"]
    print(f"speed-up from speculation: direct {sa / na:.2f}x, termchat ask {sb / nb:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
