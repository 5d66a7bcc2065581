"""Fewer bytes per token: which weight format is as good as float32, and how much faster?

    python -m termchat.bench.formats [--per-category 4] [--runs 1] [--formats bfloat16,int4]

Decoding one token at batch 1 reads every weight once, so fewer bytes per
weight (float32 4, bfloat16 2, termchat_int4 0.625 for the layers) can make
it that much faster, where the CPU has a kernel for the format. Each format
runs as the default profile's engine without speculation (compiled):

- float32: the reference (the default model's weights are its GGUF's
  dequantized blocks);
- bfloat16: `dtype = "bfloat16"`;
- int4: `quantization = "termchat_int4"` (vllm_ext/int4.py: the layers'
  Q4_1 codes on torch's int4 kernel, the output layer in bfloat16);
  int4-f32head: the same with a float32 output layer; int4-int4head: with
  the output layer on the int4 kernel too (its Q8_0 weights quantized again);
  int4-int8head: with the output layer on torch's int8 kernel (a scale per row).

The quality guard (a variant may become a default only if it passes):
- the float32 engine's greedy reply to each prompt (64 tokens) is scored
  under every engine (`prompt_logprobs` of the same tokens): the mean
  log-probability under the variant within 1% of float32's own, over at
  least 1,000 tokens;
- its own 128-token greedy replies (to every built-in prompt, 60 by default:
  `--loop-prompts` per category) loop no more than float32's: their mean
  distinct-2 is at most 0.01 lower, and, prompt by prompt, the replies that
  loop (chat/loops.py) under the variant but not under float32 outnumber the
  reverse by no more than chance allows (a one-sided sign test at 5%). A bare
  count would let chance decide: once greedy text parts at a near-tie, whether
  a 128-token reply loops is close to a coin that lands "loops" one time in
  four, so two equally good formats differ by a loop or two in 20 replies;
- their Python blocks parse at least as often;
- greedy-text identity with float32 is reported and decides nothing: greedy
  text parts at near-ties without any loss.

Speed: median decode tokens/s of the 128-token greedy replies, the engines
one after the other (`--runs` alternations), plain decoding.
"""

from __future__ import annotations

import argparse
import statistics

from termchat.bench.prompt_sets import builtin
from termchat.bench import roofline
from termchat.bench.repetition import distinct_2, loop_pairs, parses, sign_test_p
from termchat.bench.roofline import read_bandwidth
from termchat.engine.client import Sampling, complete_sync
from termchat.engine import weights
from termchat.engine.connect import open_engine
from termchat.errors import UserError
from termchat.profiles import WEIGHT_FORMATS, builtin_profiles, in_format
from termchat.progress import engine_start_line

GUARD_TOKENS = 64
LOGPROB_LIMIT = 0.01  # relative


async def continuation_logprob(engine, prompt: str, reply: str) -> tuple[float, int]:
    """Sum and count of the log-probabilities of `reply`'s tokens after `prompt`, under `engine`."""
    user = [{"role": "user", "content": prompt}]
    head = await engine.client.post(engine.root_url + "/tokenize", json={"model": engine.model_name, "messages": user, "add_generation_prompt": True})
    head.raise_for_status()
    start = head.json()["count"]
    body = {
        "model": engine.model_name,
        "messages": [*user, {"role": "assistant", "content": reply}],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0,
    }
    response = await engine.client.post(engine.base_url + "/chat/completions", json=body, timeout=120.0)
    response.raise_for_status()
    entries = response.json()["prompt_logprobs"][start:]
    # prompt_logprobs = 0: each position holds its own token only
    values = [next(iter(entry.values()))["logprob"] for entry in entries if entry]
    return sum(values), len(values)


async def continuation_tokens(engine, prompt: str, reply: str) -> tuple[list[int], int]:
    """The token ids of `prompt` (chat template) and `reply`, as `engine` tokenizes them, and where the reply starts."""
    user = [{"role": "user", "content": prompt}]
    head = await engine.client.post(engine.root_url + "/tokenize", json={"model": engine.model_name, "messages": user, "add_generation_prompt": True})
    whole = await engine.client.post(engine.root_url + "/tokenize", json={"model": engine.model_name, "messages": [*user, {"role": "assistant", "content": reply}],
                                                                           "continue_final_message": True, "add_generation_prompt": False})
    head.raise_for_status()
    whole.raise_for_status()
    return whole.json()["tokens"], head.json()["count"]


def llama_cpp_scores(sequences: list[tuple[list[int], int]]) -> list[tuple[float, int]] | None:
    """Sum and count of the log-probabilities llama.cpp (llama-cpp-python, on the
    packaged GGUF file) gives the same reply tokens; None where it is not installed."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    import numpy as np

    from termchat.models import _gguf_path

    llm = Llama(model_path=str(_gguf_path(quiet=True)), n_ctx=4096, n_batch=1, logits_all=True, verbose=False)  # n_batch=1: bench.peers says why
    scored = []
    for ids, start in sequences:
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
        logits -= logits.max(-1, keepdims=True)
        logprobs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        values = [logprobs[i - 1, ids[i]] for i in range(start, len(ids))]
        scored.append((float(sum(values)), len(values)))
    return scored


def more_loops_than_chance(variant: list[bool], reference: list[bool], alpha: float = 0.05) -> bool:
    """Do the prompts whose reply loops only under the variant outnumber those
    that loop only under the reference by more than chance (one-sided sign test)?"""
    return sign_test_p(*loop_pairs(variant, reference)) < alpha


def run_engine(profile, prompts: list[str], references: list[str] | None, loop_prompts: list[str]):
    """Greedy 64-token replies, 128-token replies (speed, loops, code), and the
    reference replies' log-probabilities under this engine."""
    engine = open_engine(profile, progress=engine_start_line(), attach=False)
    try:
        complete_sync(engine, [{"role": "user", "content": "Say hi."}], Sampling(temperature=0.0, max_tokens=8))
        greedy = [complete_sync(engine, [{"role": "user", "content": p}], Sampling(temperature=0.0, max_tokens=GUARD_TOKENS)) for p in prompts]
        long = [complete_sync(engine, [{"role": "user", "content": p}], Sampling(temperature=0.0, max_tokens=128)) for p in loop_prompts]
        refs = references or [g.text for g in greedy]
        scored = [engine.run(lambda p=p, r=r: continuation_logprob(engine, p, r)) for p, r in zip(prompts, refs)]
        tokens = [engine.run(lambda p=p, r=r: continuation_tokens(engine, p, r)) for p, r in zip(prompts, refs)] if references is None else None
    finally:
        engine.stop()
    return greedy, long, scored, tokens


def variants(names: list[str]) -> dict:
    """name -> the default profile's engine without speculation, in that format."""
    base = builtin_profiles()["local"].without_speculation()
    try:
        return {n: in_format(base, n) for n in ["float32", *names]}
    except UserError as exc:
        raise SystemExit(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    from termchat.chat.loops import loops
    from termchat.bench.command import machine_line

    parser = argparse.ArgumentParser(prog="python -m termchat.bench.formats", description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-category", type=int, default=4)
    parser.add_argument("--loop-prompts", type=int, default=12, help="prompts per category for the 128-token replies (speed, loops, code); 12 is all")
    parser.add_argument("--runs", type=int, default=1, help="alternations of the engines for the speed figure")
    parser.add_argument("--formats", default="bfloat16,int4", help=f"variants beside float32 (of {', '.join(WEIGHT_FORMATS)})")
    parser.add_argument("--record", action="store_true", help="record the fastest format that passes the guard as this machine's choice for `weights = \"auto\"`")
    args = parser.parse_args(argv)
    profiles = variants([n.strip() for n in args.formats.split(",") if n.strip() and n.strip() != "float32"])
    by_category: dict[str, list] = {}
    for prompt in builtin():
        by_category.setdefault(prompt.category, []).append(prompt)
    chosen = [p for items in by_category.values() for p in items[: args.per_category]]
    prompts = [p.text for p in chosen]
    looped_at = [p for items in by_category.values() for p in items[: max(args.loop_prompts, 1)]]
    print(machine_line(), flush=True)
    speeds: dict[str, list[float]] = {n: [] for n in profiles}
    first: dict[str, tuple] = {}
    reference_tokens: list = []
    for run in range(args.runs):
        for name, profile in profiles.items():
            refs = [g.text for g in first["float32"][0]] if "float32" in first else None
            greedy, long, scored, tokens = run_engine(profile, prompts, refs, [p.text for p in looped_at])
            first.setdefault(name, (greedy, long, scored))
            if tokens is not None:
                reference_tokens = tokens
            speeds[name].append(statistics.median(s.stats.decode_tokens_per_s for s in long if s.stats.decode_tokens_per_s))
            print(f"run {run + 1}: {name} {speeds[name][-1]:.1f} tok/s", flush=True)
    ref_greedy, _, ref_scored = first["float32"]
    tokens = sum(n for _, n in ref_scored)
    ref_mean = sum(s for s, _ in ref_scored) / tokens
    bandwidth = read_bandwidth()
    step_bytes = {n: roofline.for_profile(p).weight_bytes for n, p in profiles.items()}
    print(f"\n{len(prompts)} built-in prompts ({args.per_category} per category), plain decoding, greedy; "
          f"{tokens} tokens of float32's replies scored; memory read {bandwidth / 1e9:.1f} GB/s\n")
    names = list(profiles)
    print("| | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    row = lambda label, cells: print(f"| {label} | " + " | ".join(cells) + " |")  # noqa: E731
    median = {n: statistics.median(speeds[n]) for n in names}
    a = median["float32"]
    row(f"decode tok/s (median of {args.runs} run(s))", [f"{median[n]:.1f}" for n in names])
    row("speed-up over float32", [f"{median[n] / a:.2f}x" for n in names])
    row("weight bytes read per step", [f"{step_bytes[n] / 1e6:.0f} MB" for n in names])
    row("share of the memory limit reached", [f"{median[n] * step_bytes[n] / bandwidth:.0%}" for n in names])
    verdicts = {}
    for n in names:
        greedy, long, scored = first[n]
        mean = sum(s for s, _ in scored) / sum(k for _, k in scored)
        shift = abs(mean - ref_mean) / abs(ref_mean)
        code = [parses(s.text) for s, p in zip(long, looped_at) if p.category == "code"]
        looped = [loops(s.text) for s in long]
        verdicts[n] = dict(mean=mean, shift=shift, identical=sum(x.text == y.text for x, y in zip(ref_greedy, greedy)),
                           d2=statistics.fmean(distinct_2(s.text) for s in long), looped=looped, loops=sum(looped),
                           parsed=sum(c is True for c in code), blocks=sum(c is not None for c in code))
    row("mean log-probability of float32's greedy replies", [f"{verdicts[n]['mean']:.4f}" for n in names])
    row("shift from float32 (limit 1%)", [f"{verdicts[n]['shift']:.2%}" for n in names])
    peer = llama_cpp_scores(reference_tokens)
    if peer is not None:  # the same tokens under llama.cpp on the GGUF file: what its kernels shift
        peer_mean = sum(s for s, _ in peer) / sum(k for _, k in peer)
        print(f"llama.cpp (llama-cpp-python, the GGUF file) on the same tokens: mean log-probability {peer_mean:.4f}, shift from float32 {abs(peer_mean - ref_mean) / abs(ref_mean):.2%}")
    row(f"distinct-2 of its {len(looped_at)} 128-token replies / replies that loop", [f"{verdicts[n]['d2']:.3f} / {verdicts[n]['loops']}" for n in names])
    row("replies that loop here and not under float32 / the reverse", ["{} / {}".format(*loop_pairs(verdicts[n]["looped"], verdicts["float32"]["looped"])) for n in names])
    row("code replies' Python blocks that parse", [f"{verdicts[n]['parsed']}/{verdicts[n]['blocks']}" for n in names])
    row(f"greedy first {GUARD_TOKENS} tokens identical to float32's (decides nothing)", [f"{verdicts[n]['identical']}/{len(prompts)}" for n in names])
    ref = verdicts["float32"]
    passed = {"float32": True}
    for n in names[1:]:
        v = verdicts[n]
        passed[n] = tokens >= 1000 and v["shift"] <= LOGPROB_LIMIT and not more_loops_than_chance(v["looped"], ref["looped"]) and v["d2"] >= ref["d2"] - 0.01 and v["parsed"] >= ref["parsed"]
        refused = weights.refusal(n)
        print(f"quality guard, {n}: {'PASS' if passed[n] else 'FAIL'}" + (f"; refused on this CPU: {refused}" if refused else ""))
        passed[n] = passed[n] and refused is None
    best = max((n for n in names if passed[n]), key=median.get)
    print(f"fastest passing the guard here: {best} ({median[best]:.1f} tok/s, {median[best] / a:.2f}x float32)")
    if args.record:
        weights.record(profiles["float32"].model, best, median, passed, machine_line())
        print(f'recorded in {weights.record_path()}: `weights = "auto"` runs {best} on this machine')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
