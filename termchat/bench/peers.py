"""termchat beside what a user would run instead, same prompts, same run.

    python -m termchat.bench.peers [--per-category 4] [--max-tokens 128] [--profiles local,local-plain,local-plain:int4] [--categories edit]

On the built-in bench prompts (the first N of each category), greedy (T=0),
one after the other on this machine (one engine at a time):

- termchat's profiles: the real vLLM engine as termchat starts it; NAME:FORMAT
  runs a built-in profile with its weights in that format (`weights = FORMAT`);
- Hugging Face transformers on the same float32 weights: plain `generate`,
  and with prompt lookup (`prompt_lookup_num_tokens=10`, its speculation);
- llama.cpp (llama-cpp-python, the optional extra `peers`) on the packaged
  Q4_1 GGUF file the default model is converted from (what Ollama and LM
  Studio would run), plain.

With `--files 1.7b,7b`, also on files of the sizes users bring (written by
bench/user_files.py: a SmolLM2-1.7B-shape Q4_1 file and a Mistral-7B-shape
Q4_K_M one, random weights): each is added with `termchat models add` into a
models folder of the bench's own and served from a one-line profile
(`model = "termchat:NAME"`: the built-ins' CPU settings, the GGUF's own
blocks on ggml), plain, beside llama.cpp on the same file; with the time and
bytes `models add` took and the engine's resident memory after its replies:
each process's RSS summed, and the group's PSS, which counts the pages the
engine core shares with the server it was forked from once.

llama.cpp runs with n_batch=1 (its build here crashes in batched prefill:
GCC 12 miscompiles ggml's AMX tile configuration at -O3, see
vllm_ext/amx_gcc12_fix.h; termchat's own ggml build carries the fix).
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

from termchat.bench.prompt_sets import builtin, named
from termchat.errors import UserError
from termchat.progress import engine_start_line


def termchat_profile(spec: str):
    """A built-in profile by name, or NAME:FORMAT with its weights in that format."""
    from termchat.profiles import builtin_profiles, in_format

    name, _, weights = spec.partition(":")
    profile = builtin_profiles()[name]
    return in_format(profile, weights) if weights else profile


def profile_specs(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """A bench's comma-separated NAME or NAME:FORMAT list, each a built-in
    profile and a known weight format; else the parser's one-line error."""
    from termchat.profiles import WEIGHT_FORMATS, builtin_profiles

    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n.partition(":")[0] not in builtin_profiles() or (n.partition(":")[2] or "float32") not in WEIGHT_FORMATS]
    if unknown or not names:
        parser.error(f"unknown profile(s) {', '.join(unknown) or repr(text)}; built-in: {', '.join(builtin_profiles())}; formats: {', '.join(WEIGHT_FORMATS)}")
    return names


def termchat_speeds(spec: str, prompts, max_tokens: int) -> list[float]:
    from termchat.engine.client import Sampling, complete_sync
    from termchat.engine.connect import open_engine

    engine = open_engine(termchat_profile(spec), progress=engine_start_line(), attach=False)
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


def llama_cpp_model(file=None):
    """llama.cpp (llama-cpp-python) on a GGUF file, or None where it is not installed."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    import os

    from termchat.models import _gguf_path

    # n_batch=1: llama-cpp-python 0.3.36 as built here segfaults in batched prefill (any
    # prompt of more than one token with n_batch > 1); one token per batch only slows the
    # prefill, which the decode figure leaves out
    return Llama(model_path=str(file or _gguf_path(quiet=True)), n_ctx=4096, n_batch=1, n_threads=os.cpu_count(), verbose=False)


def llama_cpp_build() -> str:
    """Which llama.cpp build ran, in words: its instruction sets decide its speed (a generic
    build is 2x slower than a native one on AMX machines)."""
    try:
        import llama_cpp
    except ImportError:
        return "not installed"
    info = llama_cpp.llama_print_system_info().decode(errors="replace").replace("CPU :", "").strip(" |")
    return f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')} ({info})"


def llama_cpp_speed(llm, prompt: str, max_tokens: int) -> float:
    first = None
    count = 0
    for chunk in llm.create_chat_completion([{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0.0, stream=True):
        if "content" in chunk["choices"][0]["delta"]:  # one chunk per token
            count += 1
            first = first or time.perf_counter()
    ended = time.perf_counter()
    return (count - 1) / (ended - first) if first and count > 1 else 0.0


def llama_cpp_speeds(prompts, max_tokens: int, file=None) -> list[float] | None:
    llm = llama_cpp_model(file)
    return None if llm is None else [llama_cpp_speed(llm, p.text, max_tokens) for p in prompts]


def added_profile(name: str):
    """A user-size file (bench/user_files.py) added with `models add` into a
    models folder of the bench's own, and its one-line profile: (profile,
    file, seconds `models add` took, bytes it wrote)."""
    import os

    from termchat import paths
    from termchat.bench import user_files
    from termchat.models import gguf_import
    from termchat.profiles import parse_config

    file = user_files.path(name)
    models = paths.cache_dir() / "bench-models"  # the bench's own: the user's model list is left alone
    os.environ["TERMCHAT_MODELS"] = str(models)  # for the engine it starts too
    short = f"bench-{name}"
    target = models / "added" / short
    if target.exists():
        gguf_import.remove(short)
    started = time.monotonic()
    gguf_import.add(file, short, quiet=True)
    added_s = time.monotonic() - started
    written = sum(f.stat().st_size for f in target.iterdir())
    config, _ = parse_config(f'[profiles."{short}"]\nmodel = "termchat:{short}"\n', "one-line profile")
    return config.get(short), file, added_s, written


def user_file_row(name: str, prompts, max_tokens: int) -> dict:
    """One user-size file: added, served by termchat plain, and by llama.cpp, in this run."""
    from termchat.engine import proc
    from termchat.engine.client import Sampling, complete_sync
    from termchat.engine.connect import open_engine

    profile, file, added_s, written = added_profile(name)
    # both loaded side by side (an idle one takes no CPU), each prompt asked of one and then the
    # other: the host drifts (the same kernel 2x slower an hour later, bench README), so each
    # ratio is of two replies a few seconds apart
    llm = llama_cpp_model(file)
    print(f"termchat and llama.cpp on {file.name}, prompt by prompt ...", file=sys.stderr, flush=True)
    engine = open_engine(profile, progress=engine_start_line(), attach=False)
    ours, theirs = [], []
    try:
        complete_sync(engine, [{"role": "user", "content": "Say hi."}], Sampling(temperature=0.0, max_tokens=8))
        for p in prompts:
            ours.append(complete_sync(engine, [{"role": "user", "content": p.text}], Sampling(temperature=0.0, max_tokens=max_tokens)).stats.decode_tokens_per_s or 0.0)
            if llm is not None:
                theirs.append(llama_cpp_speed(llm, p.text, max_tokens))
        rss, pss = proc.rss_bytes(engine.pid), proc.pss_bytes(engine.pid)
    finally:
        engine.stop()
    return {"file": file, "bytes": file.stat().st_size, "added_s": added_s, "written": written, "rss": rss, "pss": pss, "termchat": ours, "llama.cpp": theirs or None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m termchat.bench.peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-category", type=int, default=4)
    parser.add_argument("--categories", default="", help="built-in categories, comma-separated (default: the five of Spec-Bench; `edit` is asked for by name)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--profiles", default="local,local-plain", help="built-in profiles, comma-separated; NAME:FORMAT for another weight format (int4, bfloat16, ...)")
    parser.add_argument("--files", default="", help="user-size files too, comma-separated, of: 1.7b, 7b (bench/user_files.py)")
    parser.add_argument("--file-prompts", type=int, default=4, help="prompts (of the chat category) for each user-size file")
    parser.add_argument("--no-transformers", action="store_true", help="leave out the transformers columns")
    args = parser.parse_args(argv)
    from termchat.bench import user_files

    files = [f.strip() for f in args.files.split(",") if f.strip()]
    if [f for f in files if f not in user_files.SHAPES]:
        parser.error(f"--files takes {', '.join(user_files.SHAPES)}")
    names = profile_specs(parser, args.profiles)
    try:
        chosen = builtin(named(args.categories))
    except UserError as exc:
        parser.error(str(exc))
    seen: dict[str, int] = defaultdict(int)
    prompts = []
    for p in chosen:
        seen[p.category] += 1
        if seen[p.category] <= args.per_category:
            prompts.append(p)
    columns: dict[str, list[float] | None] = {}
    for name in names:
        print(f"termchat {name} ...", file=sys.stderr, flush=True)
        columns[f"termchat {name}"] = termchat_speeds(name, prompts, args.max_tokens)
    if not args.no_transformers:
        print("transformers ...", file=sys.stderr, flush=True)
        columns["transformers f32"] = transformers_speeds(prompts, args.max_tokens, None)
        columns["transformers f32 lookup"] = transformers_speeds(prompts, args.max_tokens, 10)
    print("llama.cpp ...", file=sys.stderr, flush=True)
    columns["llama.cpp Q4_1"] = llama_cpp_speeds(prompts, args.max_tokens)
    categories = list(dict.fromkeys(p.category for p in prompts))
    from termchat.bench.command import machine_line
    from termchat.bench.roofline import read_bandwidth

    print("\n" + machine_line(read_bandwidth()))
    print(f"llama.cpp: {llama_cpp_build()}")
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
    chats = [p for p in builtin() if p.category == "chat"][: args.file_prompts]
    rows = [user_file_row(name, chats, args.max_tokens) for name in files]
    if rows:
        print(f"\nuser-size files (random weights), plain decoding, T=0, {args.max_tokens} tokens, {len(chats)} chat prompts (median decode tok/s)\n")
        print("| file | size | `models add` | written | termchat | llama.cpp | termchat / llama.cpp, prompt by prompt | engine memory (RSS summed / PSS) | memory - file (RSS / PSS) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            ours = statistics.median(s for s in r["termchat"] if s) if any(r["termchat"]) else None
            theirs = statistics.median(s for s in r["llama.cpp"] if s) if r["llama.cpp"] and any(r["llama.cpp"]) else None
            pairs = [a / b for a, b in zip(r["termchat"], r["llama.cpp"] or []) if a and b]
            ratio = f"{statistics.median(pairs):.2f} ({min(pairs):.2f}-{max(pairs):.2f})" if pairs else "-"
            print(f"| {r['file'].name} | {r['bytes'] / 1e9:.2f} GB | {r['added_s']:.1f} s | {r['written'] / 1e6:.1f} MB | {ours or 0:.1f} | {theirs or 0:.1f} | {ratio} | "
                  f"{r['rss'] / 1e9:.2f} / {r['pss'] / 1e9:.2f} GB | {(r['rss'] - r['bytes']) / 1e9:+.2f} / {(r['pss'] - r['bytes']) / 1e9:+.2f} GB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
