"""A profile's weight format: forced (`weights = "int4"`), or `weights = "auto"`,
the fastest format that `python -m termchat.bench.formats --record` measured
passing the quality guard on this CPU.

The record is a state file (formats.json, 0600) keyed by the machine (CPU
model, ISA flags, cores) and the model: a figure from another machine, or one
that does not parse, is not used (auto then means float32, the reference).
A format whose kernel this CPU lacks is refused with its reason, and the next
fastest is taken: by the record's speeds where there is one, else in FALLBACK's
order.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace

from termchat import numbers, paths
from termchat.engine import proc
from termchat.errors import UserError

AUTO = "auto"
# the fallback order when nothing was measured here: int4 first (2.35x float32
# on the AVX-512 Xeon, 2.37x on the AVX2 EPYC, log-probabilities within 0.13%),
# then fewer bytes per step first; int4-int4head is not in it, its
# log-probabilities are 5.9% from float32's (bench README)
FALLBACK = ("ggml", "int4", "int4-int8head", "int4-f32head", "bfloat16", "float32")
# vLLM's CPU kernels convert float32 to bfloat16 with the CPU's own rounding
# instruction only where it has one (csrc/cpu/cpu_types_x86.hpp); elsewhere they
# drop the low 16 bits, a bias toward zero that compounds through the residual
# stream (measured layer by layer on an AVX2 EPYC: bench README, "bfloat16 on AVX2")
BF16_FLAGS = {"avx512_bf16", "amx_bf16"}


def record_path():
    return paths.state_dir() / "formats.json"


def machine_key() -> str:
    flags = proc.cpu_flags()
    isa = " ".join(f for f in proc.ISA_FLAGS if f in flags) or "no AVX2"
    return f"{proc.cpu_model()} | {isa} | {os.cpu_count()} cores"


def gguf_only(model: str) -> bool:
    """A termchat model that exists only as its GGUF file (`models add`): ggml is its one format."""
    from termchat import models

    if not model.startswith("termchat:"):
        return False
    try:
        path = models.folder(model)
    except UserError:
        return False
    return not models.has_safetensors(path) and models.gguf_file_of(path) is not None


def refusal(fmt: str, model: str | None = None) -> str | None:
    """Why this machine cannot run `fmt` well (for `model`), in one line, or None."""
    if model is not None and fmt != "ggml" and gguf_only(model):
        return f"{model} is served from its GGUF file as it is (weights = \"ggml\"), not as {fmt}"
    if fmt == "ggml":
        from termchat.vllm_ext import ggml

        reason = ggml.unavailable()
        if reason is None and model is not None:
            from termchat import models

            try:
                has_file = model.startswith("termchat:") and models.gguf_file_of(models.folder(model)) is not None
            except UserError:
                has_file = False
            if not has_file:
                reason = f"ggml serves a GGUF file as it is, and {model} names none (a termchat model does: `termchat models add FILE.gguf`)"
        return reason
    if fmt.startswith("int4"):
        flags = proc.cpu_flags()
        if "avx2" not in flags and "avx512f" not in flags:
            return f"{fmt} needs AVX2 or AVX-512 (torch's int4 kernel has no other fast path); this CPU ({proc.cpu_model()}) has neither"
    if fmt == "bfloat16" and not BF16_FLAGS & proc.cpu_flags():
        return (f"bfloat16 needs AVX512-BF16 or AMX on this CPU ({proc.cpu_model()}): without them vLLM's CPU kernels "
                "round to bfloat16 by truncation, which drifts every layer (log-probabilities 10.6% from float32, bench README)")
    return None


def _read() -> dict:
    data = paths.read_json(record_path())
    return data if isinstance(data, dict) else {}


SPEED = (0.01, 1e5)  # decode tokens/s: outside this, not a measurement of ours


def recorded(model: str) -> dict | None:
    """This machine's measured choice for `model`, checked where it enters:
    {"format", "tok_s", "guard", "measured_at"} with every speed a finite
    number in SPEED, the chosen format among them, the guard's verdicts
    booleans; None when there is none or it does not hold up."""
    from termchat.profiles import WEIGHT_FORMATS

    entry = _read().get(machine_key(), {})
    entry = entry.get(model) if isinstance(entry, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("format"), str) or entry["format"] not in WEIGHT_FORMATS:
        return None
    speeds = entry.get("tok_s")
    if not isinstance(speeds, dict) or not speeds or len(speeds) > len(WEIGHT_FORMATS):
        return None
    checked = {k: numbers.real(v, *SPEED) for k, v in speeds.items() if isinstance(k, str) and k in WEIGHT_FORMATS}
    if len(checked) != len(speeds) or None in checked.values() or entry["format"] not in checked:
        return None
    guard = entry.get("guard")
    guard = {k: v for k, v in guard.items() if isinstance(k, str) and isinstance(v, bool)} if isinstance(guard, dict) else {}
    return {"format": entry["format"], "tok_s": checked, "guard": guard, "measured_at": numbers.real(entry.get("measured_at"), 0.0, 1e11)}


def record(model: str, choice: str, speeds: dict[str, float], passed: dict[str, bool], machine: str) -> None:
    data = _read()
    mine = data.get(machine_key())
    mine = mine if isinstance(mine, dict) else {}
    mine[model] = {"format": choice, "tok_s": {k: round(v, 2) for k, v in speeds.items()}, "guard": passed, "measured_at": time.time(), "machine": machine}
    data[machine_key()] = mine
    paths.private_dir(record_path().parent)
    paths.write_private(record_path(), json.dumps(data, indent=2).encode())


def choice_line(model: str) -> str:
    """`models list`'s line on what `weights = "auto"` runs for `model` here:
    choose()'s answer, with the record's speeds and date beside it."""
    fmt, why = choose_format(AUTO, model)
    entry = recorded(model)
    if entry is None:
        return f'weights = "auto" here: {fmt}, nothing measured on this machine yet (`python -m termchat.bench.formats --record`)'
    if fmt != entry["format"]:
        return f'weights = "auto" here: {fmt} ({why})'
    speeds = ", ".join(f"{k} {v:.1f}" for k, v in sorted(entry["tok_s"].items(), key=lambda kv: -kv[1]))
    when = entry["measured_at"]
    day = time.strftime("%Y-%m-%d", time.localtime(when)) if when else "an unknown date"
    return f'weights = "auto" here: {fmt}, the fastest passing the quality guard (decode tok/s {speeds}; measured {day})'


def choose(profile) -> tuple[str, str]:
    """(the format the profile's engine runs, why), or ("", "") when the profile
    names no format (its dtype and quantization stand as written)."""
    return choose_format(profile.weights, profile.model)


def choose_format(wanted: str | None, model: str) -> tuple[str, str]:
    """choose() for a format asked for (`weights`) and a model."""
    if wanted is None and not gguf_only(model):
        return "", ""
    if gguf_only(model):
        reason = refusal("ggml", model)
        if reason:
            raise UserError(f"{model} can only be served from its GGUF file, and here {reason}")
        return "ggml", f"{model} is served from its GGUF file as it is"
    entry = recorded(model)
    order = sorted(entry["tok_s"], key=lambda k: -entry["tok_s"][k]) if entry else list(FALLBACK)
    if wanted == AUTO:
        if entry is None:
            first = next((f for f in FALLBACK if refusal(f, model) is None), "float32")
            return first, f"weights = \"auto\": nothing measured on this machine yet, so {first}, the first of {', '.join(FALLBACK)} this machine runs (`python -m termchat.bench.formats --record` measures them)"
        wanted, why = entry["format"], f"weights = \"auto\": {entry['format']}, measured fastest here passing the quality guard"
    else:
        why = f"weights = \"{wanted}\""
    reason = refusal(wanted, model)
    if reason is None:
        return wanted, why
    fallback = next((f for f in order if f != wanted and refusal(f, model) is None and (entry is None or entry["guard"].get(f, f == "float32"))), "float32")
    return fallback, f"{reason}: {fallback} instead"


def finding(profile):
    """doctor's line on the profile's weight format: a warning when a forced
    format is refused here, else the choice and why; without `weights`, a
    warning for `dtype = "bfloat16"` where it drifts, else None."""
    from termchat.profiles.advisor import Finding

    if profile.is_remote:
        return None
    if not profile.weights:
        reason = refusal("bfloat16") if profile.dtype == "bfloat16" else None
        return Finding("warning", "dtype", f'{reason}; use weights = "auto" or dtype = "float32"') if reason else None
    fmt, why = choose(profile)
    return Finding("warning" if profile.weights != AUTO and fmt != profile.weights else "info", "weights", why)


def applied(profile):
    """The profile as its engine runs it: its weight format's dtype and
    quantization in place of its own (profiles.WEIGHT_FORMATS), same name."""
    from termchat.profiles import in_format

    fmt, _ = choose(profile)
    if not fmt:
        return profile
    if profile.is_remote:
        raise UserError(f"profile '{profile.name}': `weights` chooses the format of an engine termchat starts; a remote endpoint's server chooses its own. Remove it.")
    return replace(in_format(profile, fmt), name=profile.name)
