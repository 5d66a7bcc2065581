"""termchat beside what a user would run instead, same prompts, same run.

    python -m termchat.bench.peers [--per-category 4] [--max-tokens 128] [--profiles local,local-plain,local-plain:int4]

On the built-in bench prompts (the first N of each category), greedy (T=0),
one after the other on this machine (one engine at a time):

- termchat's profiles: the real vLLM engine as termchat starts it; NAME:FORMAT
  runs a built-in profile with its weights in that format (`weights = FORMAT`);
- Hugging Face transformers on the same float32 weights: plain `generate`,
  and with prompt lookup (`prompt_lookup_num_tokens=10`, its speculation);
- llama.cpp (llama-cpp-python, the optional extra `peers`) on the packaged
  Q4_1 GGUF file the default model is converted from (what Ollama and LM
  Studio would run), plain.

llama.cpp runs with n_batch=1 (its build here crashes in batched prefill).
Decode tokens/s everywhere = (output tokens - 1) / (time after the first
token), the bench's definition: prefill excluded. transformers has no first
token time of its own: its prefill is timed as a 1-token generate of the
same prompt and subtracted. Medians per category.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict

from termchat.bench.prompt_sets import builtin


def termchat_profile(spec: str):
    """A built-in profile by name, or NAME:FORMAT with its weights in that format."""
    from termchat.profiles import builtin_profiles, in_format

    name, _, weights = spec.partition(":")
    profile = builtin_profiles()[name]
    return in_format(profile, weights) if weights else profile


def termchat_speeds(spec: str, prompts, max_tokens: int) -> list[float]:
    from termchat.engine.client import Sampling, complete_sync
    from termchat.engine.connect import open_engine

    engine = open_engine(termchat_profile(spec), progress=lambda line: print(line, file=sys.stderr), attach=False)
    try:
        complete_sync(engine, [{"role": "user", "content": "Say hi."}], Sampling(temperature=0.0, max_tokens=8))  # warm-up
        return [complete_sync(engine, [{"role": "user", "content": p.text}], Sampling(temperature=0.0, max_tokens=max_tokens)).stats.decode_tokens_per_s or 0.0 for p in prompts]
    finally:
        engine.stop()


def transformers_speeds(prompts, max_tokens: int, lookup: int | None) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from termchat import models
    from termchat.profiles import DEFAULT_MODEL

    folder = models.resolve(DEFAULT_MODEL)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    speeds = []
    with torch.inference_mode():
        for p in prompts:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
            started = time.perf_counter()
            model.generate(**ids, max_new_tokens=1, do_sample=False)
            prefill = time.perf_counter() - started
            started = time.perf_counter()
            out = model.generate(**ids, max_new_tokens=max_tokens, do_sample=False, **extra)
            total = time.perf_counter() - started
            new = out.shape[1] - ids["input_ids"].shape[1]
            speeds.append((new - 1) / max(1e-9, total - prefill) if new > 1 else 0.0)
    return speeds


def llama_cpp_speeds(prompts, max_tokens: int) -> list[float] | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    import os

    from termchat.models import _gguf_path

    # n_batch=1: llama-cpp-python 0.3.36 as built here segfaults in batched prefill (any
    # prompt of more than one token with n_batch > 1); one token per batch only slows the
    # prefill, which the decode figure leaves out
    llm = Llama(model_path=str(_gguf_path(quiet=True)), n_ctx=4096, n_batch=1, n_threads=os.cpu_count(), verbose=False)
    speeds = []
    for p in prompts:
        first = None
        count = 0
        for chunk in llm.create_chat_completion([{"role": "user", "content": p.text}], max_tokens=max_tokens, temperature=0.0, stream=True):
            if "content" in chunk["choices"][0]["delta"]:  # one chunk per token
                count += 1
                first = first or time.perf_counter()
        ended = time.perf_counter()
        speeds.append((count - 1) / (ended - first) if first and count > 1 else 0.0)
    return speeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m termchat.bench.peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-category", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--profiles", default="local,local-plain", help="built-in profiles, comma-separated; NAME:FORMAT for another weight format (int4, bfloat16, ...)")
    args = parser.parse_args(argv)
    from termchat.profiles import WEIGHT_FORMATS, builtin_profiles

    names = [n.strip() for n in args.profiles.split(",") if n.strip()]
    unknown = [n for n in names if n.partition(":")[0] not in builtin_profiles() or (n.partition(":")[2] or "float32") not in WEIGHT_FORMATS]
    if unknown:
        parser.error(f"unknown profile(s) {', '.join(unknown)}; built-in: {', '.join(builtin_profiles())}; formats: {', '.join(WEIGHT_FORMATS)}")
    seen: dict[str, int] = defaultdict(int)
    prompts = []
    for p in builtin():
        seen[p.category] += 1
        if seen[p.category] <= args.per_category:
            prompts.append(p)
    columns: dict[str, list[float] | None] = {}
    for name in names:
        print(f"termchat {name} ...", file=sys.stderr, flush=True)
        columns[f"termchat {name}"] = termchat_speeds(name, prompts, args.max_tokens)
    print("transformers ...", file=sys.stderr, flush=True)
    columns["transformers f32"] = transformers_speeds(prompts, args.max_tokens, None)
    columns["transformers f32 lookup"] = transformers_speeds(prompts, args.max_tokens, 10)
    print("llama.cpp ...", file=sys.stderr, flush=True)
    columns["llama.cpp Q4_1"] = llama_cpp_speeds(prompts, args.max_tokens)
    categories = list(dict.fromkeys(p.category for p in prompts))
    from termchat.bench.command import machine_line
    from termchat.bench.roofline import read_bandwidth

    print("\n" + machine_line(read_bandwidth()))
    print(f"decode tokens/s, T=0, {args.max_tokens} tokens, {args.per_category} prompts per category (median), one run on this machine\n")
    ours = [f"termchat {name}" for name in names]
    print("| category | " + " | ".join(columns) + " | " + " | ".join(f"{n} / llama.cpp" for n in names) + " |")
    print("|---" * (len(columns) + len(names) + 1) + "|")

    def median_of(speeds: list[float] | None, category: str) -> float | None:
        values = [s for p, s in zip(prompts, speeds or []) if p.category == category and s]
        return statistics.median(values) if values else None

    medians = {column: {c: median_of(speeds, c) for c in categories} for column, speeds in columns.items()}  # each once
    peer = medians["llama.cpp Q4_1"]

    def row(label: str, cells: list[float | None], ratios: list[float | None]) -> str:
        text = [f"{v:.1f}" if v else "-" for v in cells] + [f"{r:.2f}" if r else "-" for r in ratios]
        return f"| {label} | " + " | ".join(text) + " |"

    ratios = {c: {k: medians[c][k] / peer[k] for k in categories if medians[c][k] and peer[k]} for c in ours}
    for category in categories:
        print(row(category, [medians[column][category] for column in columns], [ratios[c].get(category) for c in ours]))
    print(row("median of categories", [statistics.median(v) if (v := [m for m in medians[column].values() if m]) else None for column in columns],
              [statistics.median(ratios[c].values()) if ratios[c] else None for c in ours]))
    if columns["llama.cpp Q4_1"] is None:
        print("\nllama.cpp: not installed here (pip install 'termchat[peers]' builds llama-cpp-python, about 2 minutes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
