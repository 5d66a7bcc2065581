"""Should the built-in profiles set a repetition penalty? Measured, not guessed.

    python -m termchat.bench.repetition [--per-category 6] [--max-tokens 256]

The default model loops (a poem repeating one stanza for 400 tokens; a
greedy list of colours that ends in "Grey" a hundred times). For the
built-in bench prompts, at the temperature termchat would pick (0 for code,
0.7 otherwise), one reply per prompt with each setting; per setting:

- distinct-2: distinct word pairs over all word pairs of a reply (1: no pair
  repeats), the mean over replies;
- repeated lines: the share of a reply's non-empty lines that repeat an
  earlier line of the same reply;
- looping: replies that ran to the token limit with at least a third of
  their lines repeated;
- code that parses: of the code prompts' replies with a ```python block, the
  share whose blocks all parse (a penalty also discourages the repeats code
  needs: indentation, names, brackets);
- loops: replies where one 4-word sequence is more than 25% of the words, or
  one 6-word sequence occurs 4 times (the definition of the "replies worth
  reading" issue).

`--everyday` asks six everyday text prompts instead of the bench's (a poem, a
story, a walk, a song, habits, a letter); `--seeds 2` two replies each. The
setting "guard" is what the built-in profiles do: their text guard
(`text_frequency_penalty`) on the prompts the detector calls text, none on code.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import math
import re
import statistics
import sys
import time

from termchat.bench.prompt_sets import builtin
from termchat.chat.loops import loops
from termchat.detect.classify import temperature_for
from termchat.engine.client import Sampling, complete
from termchat.engine.connect import open_engine
from termchat.errors import UserError
from termchat.profiles import WEIGHT_FORMATS, builtin_profiles, in_format
from termchat.progress import engine_start_line

SETTINGS = {
    "none": {},
    "repetition_penalty 1.1": {"repetition_penalty": 1.1},
    "repetition_penalty 1.2": {"repetition_penalty": 1.2},
    "frequency_penalty 0.5": {"frequency_penalty": 0.5},
    "guard": None,  # the profile's own: Profile.guard(kind)
}
EVERYDAY = [
    "Write a short poem about the sea at night.",
    "Tell me a short story about a lighthouse keeper.",
    "Describe a walk in a forest in autumn.",
    "Write the lyrics of a song about summer.",
    "What are some good morning habits?",
    "Write a letter to a friend you have not seen for years.",
]
FENCE = re.compile(r"```(?:python|py)\n(.*?)(?:```|\Z)", re.S)


def distinct_2(text: str) -> float:
    words = text.split()
    pairs = list(zip(words, words[1:]))
    return len(set(pairs)) / len(pairs) if pairs else 1.0


def repeated_lines(text: str) -> float:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (len(lines) - len(set(lines))) / len(lines) if lines else 0.0


def parses(text: str) -> bool | None:
    blocks = FENCE.findall(text)
    if not blocks:
        return None
    try:
        for block in blocks:
            ast.parse(block)
    except SyntaxError:
        return False
    return True


def loop_pairs(variant: list[bool], reference: list[bool]) -> tuple[int, int]:
    """(prompts whose reply loops only under the variant, those that loop only under the reference)."""
    return sum(v and not r for v, r in zip(variant, reference)), sum(r and not v for v, r in zip(variant, reference))


def sign_test_p(worse: int, better: int) -> float:
    """One-sided sign test: the chance of `worse` or more of `worse + better`
    discordant pairs going one way if either way were equally likely."""
    n = worse + better
    return sum(math.comb(n, k) for k in range(worse, n + 1)) / 2**n if n else 1.0


def print_paired(results: dict[str, list[tuple]], formats: list[str], settings: list[str]) -> None:
    """Each format against the first, reply by reply (same prompt, seed and
    setting): loops one way and not the other, and which reply has the lower
    distinct-2, each with a one-sided sign test's p (ties left out)."""
    print(f"\nPaired with {formats[0]} (same prompt, seed and setting):\n")
    print(f"| format, setting | loops here only / in {formats[0]} only (p) | distinct-2 lower here / higher here (p) | mean distinct-2 difference |")
    print("|---|---|---|---|")
    for fmt in formats[1:]:
        for name in settings:
            mine, ref = results[f"{fmt}, {name}"], results[f"{formats[0]}, {name}"]
            worse, better = loop_pairs([loops(t) for _, t, _ in mine], [loops(t) for _, t, _ in ref])
            d2 = [(distinct_2(a), distinct_2(b)) for (_, a, _), (_, b, _) in zip(mine, ref)]
            lower, higher = sum(a < b for a, b in d2), sum(a > b for a, b in d2)
            diff = statistics.fmean(a - b for a, b in d2)
            print(f"| {fmt}, {name} | {worse} / {better} (p {sign_test_p(worse, better):.3f}) | {lower} / {higher} (p {sign_test_p(lower, higher):.3f}) | {diff:+.3f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m termchat.bench.repetition", description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-category", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--profile", default="local-plain", choices=list(builtin_profiles()), help="a built-in profile (default local-plain: the sampling is the same with speculation)")
    parser.add_argument("--categories", help="comma-separated (default: all)")
    parser.add_argument("--settings", help=f"comma-separated, of: {'; '.join(SETTINGS)} (default: all)")
    parser.add_argument("--everyday", action="store_true", help="six everyday text prompts instead of the bench's")
    parser.add_argument("--seeds", type=int, default=1, help="replies per prompt and setting, each with its own seed")
    parser.add_argument("--first-seed", type=int, default=1, help="the first of those seeds (a fresh sample: seeds not used before)")
    parser.add_argument("--format", help=f"instead of --profile: the default profile's engine without speculation in this weight format ({', '.join(WEIGHT_FORMATS)}); "
                        "several, comma-separated, run one after the other on the same prompts and seeds, each compared reply by reply with the first")
    parser.add_argument("--show-loops", action="store_true", help="print the start and end of every reply counted as a loop (to judge false alarms)")
    args = parser.parse_args(argv)
    names = args.settings.split(",") if args.settings else list(SETTINGS)
    unknown = [name for name in names if name not in SETTINGS]
    if unknown:
        parser.error(f"unknown setting {', '.join(map(repr, unknown))}; known: {'; '.join(SETTINGS)}")
    settings = {name: SETTINGS[name] for name in names}
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    engines = {args.profile: builtin_profiles()[args.profile]}
    if args.format:
        try:
            engines = {f: in_format(builtin_profiles()["local"].without_speculation(), f) for f in (f.strip() for f in args.format.split(",")) if f}
        except UserError as exc:
            parser.error(str(exc))
    profile = next(iter(engines.values()))  # the sampling settings are the default profile's in every format
    by_category: dict[str, list] = {}
    try:
        chosen = builtin(args.categories.split(",") if args.categories else None)
    except UserError as exc:
        parser.error(str(exc))
    for prompt in chosen:
        by_category.setdefault(prompt.category, []).append(prompt)
    prompts = [p for items in by_category.values() for p in items[: args.per_category]]
    if args.everyday:
        from termchat.bench.prompt_sets import BenchPrompt

        prompts = [BenchPrompt(f"everyday-{i}", "everyday", text) for i, text in enumerate(EVERYDAY)]
        by_category = {"everyday": prompts}
    started = time.monotonic()
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    results: dict[str, list[tuple]] = {}
    for label, profile in engines.items():
        engine = open_engine(profile, progress=engine_start_line(), attach=False)
        try:
            for name, knobs in settings.items():
                gate = asyncio.Semaphore(4)

                async def one(prompt, seed, knobs=knobs, profile=profile, engine=engine):
                    value, kind = temperature_for(prompt.text, profile.temperature, profile.code_temperature)
                    chosen = profile.guard(kind.kind) if knobs is None else knobs
                    async with gate:
                        stream = await complete(engine, [{"role": "system", "content": profile.system_prompt}, {"role": "user", "content": prompt.text}], Sampling(temperature=value, top_p=profile.top_p, max_tokens=args.max_tokens, seed=seed, **chosen))
                    return prompt.category, stream.text, stream.stats.finish_reason if stream.stats else None

                async def every(one=one):
                    return await asyncio.gather(*(one(p, seed) for p in prompts for seed in seeds))

                key = name if len(engines) == 1 else f"{label}, {name}"
                results[key] = engine.run(every)
                print(f"{key}: done ({time.monotonic() - started:.0f} s)", file=sys.stderr)
        finally:
            engine.stop()
    from termchat.bench.command import machine_line

    print(machine_line())
    print(f"{len(prompts)} {'everyday' if args.everyday else 'built-in'} prompts, {args.seeds} reply(ies) each per setting (seeds {seeds[0]}-{seeds[-1]}), up to {args.max_tokens} tokens, "
          f"T = 0 for code and {profile.temperature:g} otherwise, {'formats ' + ', '.join(engines) if args.format else 'profile ' + profile.name}\n")
    print("| setting | distinct-2 | repeated lines | looping | loops (4-gram > 25% or 6-gram x4) | code that parses | distinct-2 by category |")
    print("|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        d2 = statistics.fmean(distinct_2(text) for _, text, _ in rows)
        rep = statistics.fmean(repeated_lines(text) for _, text, _ in rows)
        looping = sum(finish == "length" and repeated_lines(text) >= 1 / 3 for _, text, finish in rows)
        code = [parses(text) for category, text, _ in rows if category == "code"]
        code = [c for c in code if c is not None]
        by = " ".join(f"{c} {statistics.fmean(distinct_2(t) for cat, t, _ in rows if cat == c):.2f}" for c in by_category)
        looped = sum(loops(text) for _, text, _ in rows)
        print(f"| {name} | {d2:.3f} | {rep:.1%} | {looping}/{len(rows)} | {looped}/{len(rows)} | {sum(code)}/{len(code)} | {by} |")
    if len(engines) > 1:
        print_paired(results, list(engines), list(settings))
    if args.show_loops:
        for name, rows in results.items():
            for category, text, finish in rows:
                if loops(text):
                    flat = " ".join(text.split())
                    print(f"\n[{name}, {category}, {finish}] {flat[:160]!r} ... {flat[-160:]!r}")
    print(f"\n({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
