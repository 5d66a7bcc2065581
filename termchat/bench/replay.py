"""Speculation replayed on an engine's own greedy replies: exact steps, no timing noise.

    python -m termchat.bench.replay [--categories code,chat,extraction,edit] [--methods suffix,ngram]
                                    [--k 4,8,16] [--min-score 0,1] [--row-costs 1:1,2:1.2,...]

A speculative engine's speed is its tokens per step over what a step costs.
End to end, both move with the host (the same prompts drift by 10-30% from one
run to the next here), so a setting worth a few percent cannot be seen. This
splits the two:

- Tokens per step, exactly. A plain engine writes each prompt's greedy reply
  once (the token ids it streams). Then the drafts are replayed over the
  replies in order: suffix decoding through Arctic Inference's cache called as
  vLLM calls it, one cache for all as in one engine, or ngram through vLLM's
  own prompt lookup. Each step's draft, how much of it the reply accepts, the
  next step. The replay counts the real engines' steps to within 1-2 a reply
  for suffix and 0-5 for ngram (bench README, "Speculation replayed").
- What a step costs, from `--row-costs`: a verification step of n rows
  (the last token and n-1 drafts) in plain steps, measured in the engine.

The projected speed-up is tokens over the sum of the steps' costs, against
one token a plain step. T=0 only: at T > 0 what is accepted is random.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from pathlib import Path

import numpy as np

# rows -> cost in 1-row steps: one `local` engine's steps on the AVX-512 Xeon, timed
# by row count (bench README, "Speculation replayed"; 17 rows extrapolated); linear between
ROW_COSTS = "1:1,2:1.20,3:1.335,4:1.51,6:1.57,8:1.92,12:2.54,17:3.1"
DEPTH = 24  # vLLM's suffix_decoding_max_tree_depth
FACTOR, MIN_PROB = 1.0, 0.1  # vLLM's suffix_decoding_max_spec_factor and _min_token_prob
NGRAM_MIN, NGRAM_MAX = 2, 5  # the built-in local-ngram's prompt_lookup_min and _max (profiles/speculation.py)
MAX_MODEL_LEN = 4096  # the built-ins'
METHODS = ("suffix", "ngram")


def row_costs(text: str):
    """`rows:cost,...` as a function of the row count, linear between the points."""
    try:
        points = sorted((int(a), float(b)) for a, b in (item.split(":") for item in text.split(",")))
    except ValueError:
        raise SystemExit(f"--row-costs: {text!r} is not rows:cost,rows:cost,... (e.g. {ROW_COSTS})") from None
    if not points or points[0][0] != 1 or len({r for r, _ in points}) < len(points) or any(c <= 0 or not math.isfinite(c) for _, c in points):
        raise SystemExit("--row-costs: start at 1 row, each row count once, with positive costs")

    def cost(rows: int) -> float:
        for (a, ca), (b, cb) in zip(points, points[1:]):
            if a <= rows <= b:
                return ca + (cb - ca) * (rows - a) / (b - a)
        return points[-1][1] if rows > points[-1][0] else points[0][1]

    return cost


class _Suffix:
    """vLLM's suffix decoding: one Arctic Inference cache for every reply, as in one engine."""

    def __init__(self, k: int, min_score: float):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.k, self.min_score = k, min_score
        self.cache = SuffixDecodingCache(max_tree_depth=DEPTH, max_cached_requests=10000)  # vLLM's default cache size

    def start(self, n: int, prompt: list[int], first: list[int]) -> None:
        self.cache.start_request(n, np.array(prompt, dtype=np.int32))
        self.cache.add_active_response(n, first)

    def propose(self, n: int, context: list[int]) -> list[int]:
        draft = self.cache.speculate(n, np.array(context[-DEPTH:], dtype=np.int32), max_spec_tokens=self.k, max_spec_factor=FACTOR, min_token_prob=MIN_PROB)
        return draft.token_ids if draft.score >= self.min_score else []

    def accept(self, n: int, new: list[int]) -> None:
        self.cache.add_active_response(n, new)

    def stop(self, n: int) -> None:
        self.cache.stop_request(n)


class _Ngram:
    """vLLM's prompt lookup over the request's own tokens, with the built-in's n-grams of 2 to 5."""

    def __init__(self, k: int):
        from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

        self.k, self.lookup = k, _find_longest_matched_ngram_and_propose_tokens

    def start(self, n: int, prompt: list[int], first: list[int]) -> None:
        pass

    def propose(self, n: int, context: list[int]) -> list[int]:
        return [int(t) for t in self.lookup(np.array(context, dtype=np.int32), NGRAM_MIN, NGRAM_MAX, MAX_MODEL_LEN, self.k)]

    def accept(self, n: int, new: list[int]) -> None:
        pass

    def stop(self, n: int) -> None:
        pass


def replay(pairs: list[tuple[list[int], list[int]]], k: int, min_score: float = 0.0, method: str = "suffix") -> list[list[tuple[int, int]]]:
    """For each (prompt ids, reply ids), in order: (drafted, accepted) per decode step.
    The prefill's token comes first and is no step here. `suffix`: one cache for all
    replies, as in one engine, and a draft the cache scores below `min_score` (its
    tokens' estimated probabilities, summed) is dropped. `ngram`: vLLM's prompt lookup
    with the built-in's n-grams of 2 to 5 tokens, over the request's own tokens."""
    if method not in METHODS:
        raise ValueError(f"no replay for {method!r}")
    proposer = _Suffix(k, min_score) if method == "suffix" else _Ngram(k)
    out = []
    for n, (prompt, reply) in enumerate(pairs):
        steps: list[tuple[int, int]] = []
        context = list(prompt) + reply[:1]
        proposer.start(n, prompt, reply[:1])
        pos = 1
        while pos < len(reply):
            ids = proposer.propose(n, context)
            accepted = 0
            while accepted < len(ids) and pos + accepted < len(reply) and ids[accepted] == reply[pos + accepted]:
                accepted += 1
            new = reply[pos : pos + accepted + 1]
            proposer.accept(n, new)
            context += new
            pos += len(new)
            steps.append((len(ids), accepted))
        proposer.stop(n)
        out.append(steps)
    return out


def summary(steps: list[list[tuple[int, int]]], cost) -> dict:
    flat = [s for reply in steps for s in reply]
    tokens = sum(1 + a for _, a in flat)
    drafted = sum(d for d, _ in flat)
    return {
        "tokens_per_step": tokens / max(len(flat), 1),
        "acceptance": sum(a for _, a in flat) / drafted if drafted else 0.0,
        "speedup": tokens / sum(cost(d + 1) for d, _ in flat) if flat else 1.0,
    }


@functools.cache
def _tokenizer():
    from transformers import AutoTokenizer

    from termchat import models
    from termchat.profiles import DEFAULT_MODEL

    return AutoTokenizer.from_pretrained(str(Path(models.resolve(DEFAULT_MODEL))))


def prompt_ids(messages: list[dict]) -> list[int]:
    """The token ids the default's engine sees for these messages (its chat template)."""
    return list(_tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def greedy_replies(categories: list[str], max_tokens: int) -> dict[str, list[tuple[list[int], list[int]]]]:
    """(prompt ids, reply ids) per category, from one plain engine of the default at T=0,
    with the sampling the built-in profile sends (its text guard included)."""
    from termchat.bench.prompt_sets import builtin
    from termchat.bench.runner import Progress, _start, request
    from termchat.engine.client import complete_sync
    from termchat.profiles import builtin_profiles

    profile = builtin_profiles()["local-plain"]
    prompts = builtin(categories)
    engine = _start(profile, Progress(len(prompts), 1))
    pairs: dict[str, list[tuple[list[int], list[int]]]] = {c: [] for c in categories}
    try:
        for prompt in prompts:
            limit = 2 * max_tokens if prompt.category == "edit" else max_tokens  # an edit's reply is the whole code again
            messages, sampling = request(profile, prompt, limit, temperature=0.0)
            stream = complete_sync(engine, messages, sampling)
            pairs[prompt.category].append((prompt_ids(messages), [t for step in stream.steps for t in step.token_ids]))
    finally:
        engine.stop()
    return pairs


def main(argv: list[str] | None = None) -> int:
    from termchat.bench.command import machine_line
    from termchat.errors import UserError

    parser = argparse.ArgumentParser(prog="python -m termchat.bench.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--categories", default="code,chat,extraction,edit")
    parser.add_argument("--max-tokens", type=int, default=128, help="per reply (edits: twice this)")
    parser.add_argument("--methods", default="suffix,ngram", help="suffix and/or ngram (vLLM's prompt lookup, n-grams of 2-5)")
    parser.add_argument("--k", default="4,8,16", help="num_speculative_tokens to replay, comma-separated")
    parser.add_argument("--min-score", default="0,1", help="suffix: drop drafts scored below each of these (0: vLLM's suffix decoding)")
    parser.add_argument("--row-costs", default=ROW_COSTS, help=f"rows:cost in plain steps (default, measured: {ROW_COSTS})")
    args = parser.parse_args(argv)
    cost = row_costs(args.row_costs)
    try:
        ks = [int(x) for x in args.k.split(",")]
        scores = [float(x) for x in args.min_score.split(",")]
    except ValueError:
        parser.error("--k takes integers and --min-score numbers, comma-separated")
    if not all(1 <= k <= 64 for k in ks) or not all(0 <= s <= 64 and math.isfinite(s) for s in scores) or not 1 <= args.max_tokens <= 2048:
        parser.error("--k is 1 to 64, --min-score 0 to 64 and --max-tokens 1 to 2048")
    methods = [m.strip() for m in args.methods.split(",")]
    if not methods or any(m not in METHODS for m in methods):
        parser.error("--methods takes suffix and/or ngram")
    categories = [c.strip() for c in args.categories.split(",")]
    print(machine_line(), flush=True)
    try:
        pairs = greedy_replies(categories, args.max_tokens)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    flat = [p for c in categories for p in pairs[c]]
    print(f"\nreplies: {len(flat)} from `local-plain` at T=0; costs (rows: plain steps) {args.row_costs}\n")
    print("| method | k | min score | " + " | ".join(categories) + " | geometric mean |")
    print("|---|---|---|" + "---|" * (len(categories) + 1))
    for method, k, score in [(m, k, s) for m in methods for k in ks for s in (scores if m == "suffix" else [0.0])]:
        steps = replay(flat, k, score, method)  # in the categories' order, as in one engine
        at, row = 0, []
        for c in categories:
            s = summary(steps[at : at + len(pairs[c])], cost)
            at += len(pairs[c])
            row.append(s)
        geo = math.exp(sum(math.log(s["speedup"]) for s in row) / len(row))
        cells = [f"{s['speedup']:.3f}x ({s['tokens_per_step']:.2f} a step, {s['acceptance']:.2f})" for s in row]
        print(f"| {method} | {k} | {score:g} | " + " | ".join(cells) + f" | {geo:.3f}x |", flush=True)
    print("\neach cell: projected speed-up over a plain engine (tokens per step, drafted tokens accepted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
