"""The rules of thumb, applied to a profile: findings with a reason and a fix.

From the design notes: target and draft must both fit in GPU memory (case 1);
high temperature drops acceptance by 15-20 points (case 2); a target under
~30B gains little on a GPU, and a draft should be at most ~10% of the target
(case 3; not on CPU profiles, where the bench decides); draft and target
must share a vocabulary; more than 7 speculative tokens usually lowers the
acceptance rate.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from termchat import models
from termchat.profiles import Profile, is_loopback
from termchat.profiles.speculation import ADAPTIVE_METHODS

GIB = 1024**3

# The article's acceptance bands, for methods that propose a fixed number k of
# drafts every step (draft models, EAGLE, MTP): below 0.40 speculation costs
# more than it gives, 0.40-0.60 is a moderate gain, 0.60 and above a strong one.
ACCEPTANCE_LOW, ACCEPTANCE_HIGH = 0.40, 0.60
# ngram and suffix propose only where they find a match, and (suffix) only as
# many tokens as they trust, so their acceptance rate is not comparable with a
# fixed-k rate. What holds for every method: tokens gained per verification
# step against what a step costs, measured on this engine (the bench does).


def plain_http_warning(profile: Profile) -> str | None:
    """A remote endpoint that would get the API key in clear text."""
    if profile.endpoint and profile.api_key_env and urlsplit(profile.endpoint).scheme == "http" and not is_loopback(profile.endpoint):
        return f"profile '{profile.name}' sends its API key (${profile.api_key_env}) over plain http:// to {urlsplit(profile.endpoint).hostname}: anyone on the network path can read it; use https://"
    return None


def band(method: str | None, acceptance: float | None, tokens_per_step: float | None = None, step_cost: float | None = None) -> tuple[str | None, str]:
    """How speculation is doing: (level, words). level is "low" (costs more
    than it gives), "moderate", "strong", or None when it cannot be told."""
    if method in ADAPTIVE_METHODS:
        if tokens_per_step is None:
            return None, "no figures"
        if not step_cost:
            return None, f"{tokens_per_step:.2f} tokens per verification step (run `termchat bench` to measure what a step costs here)"
        gain = tokens_per_step / step_cost
        level = "low" if gain < 1.0 else "moderate" if gain < 1.5 else "strong"
        words = {"low": "costs more than it gives", "moderate": "moderate gain", "strong": "strong gain"}[level]
        return level, f"{tokens_per_step:.2f} tokens per step at {step_cost:.2f}x a plain step's time: {words}"
    if acceptance is None:
        return None, "no acceptance figures"
    if acceptance < ACCEPTANCE_LOW:
        return "low", "below 0.40: speculation costs more than it gives"
    if acceptance < ACCEPTANCE_HIGH:
        return "moderate", "0.40-0.60: moderate gain"
    return "strong", "0.60 and above: strong gain"


@dataclass(frozen=True)
class Finding:
    level: str  # "info" | "warning"
    rule: str
    message: str

    def __str__(self) -> str:
        return f"[{self.level}] {self.rule}: {self.message}"


@dataclass(frozen=True)
class Gpu:
    name: str
    total_mib: int
    free_mib: int


def gpus() -> list[Gpu]:
    """GPUs from nvidia-smi; an empty list where there is none."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            found.append(Gpu(parts[0], int(parts[1]), int(parts[2])))
    return found


def _local_folder(model: str) -> Path | None:
    if model.startswith("termchat:"):
        return models.folder(model) if models.is_prepared(model) else None
    path = Path(model).expanduser()
    return path if (path / "config.json").exists() else None


def _config(model: str) -> dict | None:
    folder = _local_folder(model)
    if folder is None:
        return None
    return models.read_config(folder)


def params_billion(model: str) -> float | None:
    """Parameters in billions: from the name ("70B", "135M"), else the local config."""
    name = model.rsplit("/", 1)[-1]
    match = re.search(r"(\d+(?:\.\d+)?)\s*([BbMm])(?![a-z])", name)
    if match:
        value = float(match.group(1))
        return value if match.group(2) in "Bb" else value / 1000
    config = _config(model)
    if config and {"hidden_size", "num_hidden_layers", "vocab_size"} <= set(config):
        h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
        inter = config.get("intermediate_size", 4 * h)
        return (layers * (4 * h * h + 3 * h * inter) + 2 * vocab * h) / 1e9
    return None


def bytes_per_param(quantization: str | None, name: str) -> float:
    text = f"{quantization or ''} {name}".lower()
    if any(q in text for q in ("awq", "gptq", "int4", "4bit", "q4", "nf4")):
        return 0.55  # 4-bit weights plus scales
    if any(q in text for q in ("fp8", "int8", "8bit", "w8a8")):
        return 1.0
    return 2.0


def weights_gib(model: str, quantization: str | None) -> float | None:
    folder = _local_folder(model)
    if folder is not None:
        size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        if size:
            return size / GIB
    billions = params_billion(model)
    return billions * 1e9 * bytes_per_param(quantization, model) / GIB if billions else None


def vocab_size(model: str) -> int | None:
    config = _config(model)
    return config.get("vocab_size") if config else None


def vocabulary(model: str) -> str | None:
    """A digest of a local model's tokens and their ids (tokenizer.json's
    vocabulary and added tokens), or None: two models draft for each other
    only if theirs are equal, whatever they are called."""
    import hashlib
    import json

    folder = _local_folder(model)
    if folder is None:
        return None
    try:
        tokenizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        vocab = tokenizer["model"]["vocab"]
        added = sorted((t["id"], t["content"]) for t in tokenizer.get("added_tokens", []))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(vocab, dict):
        return None
    return hashlib.sha256(json.dumps([sorted(vocab.items(), key=lambda kv: kv[1]), added], ensure_ascii=False).encode()).hexdigest()


def draft_candidates(model: str) -> list[tuple[str, float]]:
    """termchat's models (packaged or added) with `model`'s vocabulary and
    fewer parameters: (name, billions), smallest first."""
    mine, size = vocabulary(model), params_billion(model)
    if mine is None or size is None:
        return []
    found = []
    for other in [*models.BUILTIN, *models.added_names()]:
        if other != model and (b := params_billion(other)) is not None and b < size and vocabulary(other) == mine:
            found.append((other, round(b, 3)))
    return sorted(found, key=lambda item: item[1])


def family(model: str) -> str | None:
    name = model.lower()
    for pattern, label in ((r"llama-?3", "llama-3"), (r"llama-?2", "llama-2"), (r"qwen2\.5|qwen-?2\.5", "qwen2.5"), (r"qwen-?3", "qwen3"), (r"mistral|mixtral", "mistral"), (r"gemma", "gemma"), (r"smollm2", "smollm2"), (r"phi-?3", "phi-3")):
        if re.search(pattern, name):
            return label
    return None


def is_cpu_profile(profile: Profile) -> bool:
    """Written for vLLM's CPU build: CPU settings, or the packaged CPU model."""
    return not profile.is_remote and (any(k.startswith("VLLM_CPU") for k in profile.env) or models.is_termchat_model(profile.model))


def check(profile: Profile, gpu_list: list[Gpu] | None = None) -> list[Finding]:
    gpu_list = gpus() if gpu_list is None else gpu_list
    findings: list[Finding] = []
    spec = profile.speculative
    method = spec.method if spec else None
    draft = spec.model if method == "draft_model" else None
    cpu = is_cpu_profile(profile)

    # hardware and memory (case 1)
    if profile.is_remote:
        findings.append(Finding("info", "hardware", f"remote endpoint {profile.endpoint}: its memory is the server's business; nothing runs here"))
        if plain_http_warning(profile):
            findings.append(Finding("warning", "security", plain_http_warning(profile)))
    elif not gpu_list and cpu:
        findings.append(Finding("info", "hardware", "no GPU found (nvidia-smi lists none): the engine runs on the CPU; the bench, not the GPU rules, decides what pays"))
    elif not gpu_list:
        need = (weights_gib(profile.model, profile.quantization) or 0) + (weights_gib(draft, spec.options.get("quantization")) or 0 if draft else 0)
        size = f" (~{need:.0f} GiB of weights)" if need else ""
        findings.append(Finding("warning", "hardware", f"no GPU found (nvidia-smi lists none), and this profile is written for GPUs{size}. Run it on a GPU machine, point `endpoint` at one, or use the CPU profile `local`"))
    else:
        tp = profile.tensor_parallel_size or 1
        usable = [g for g in gpu_list][:tp]
        listing = ", ".join(f"{g.name} {g.free_mib / 1024:.0f}/{g.total_mib / 1024:.0f} GiB free" for g in gpu_list)
        findings.append(Finding("info", "hardware", f"{len(gpu_list)} GPU(s): {listing}"))
        target = weights_gib(profile.model, profile.quantization)
        draft_size = weights_gib(draft, spec.options.get("quantization")) if draft else 0.0
        if target is not None and draft_size is not None and usable:
            need = target + draft_size
            free = sum(g.free_mib for g in usable) / 1024 * (profile.gpu_memory_utilization or 0.9)
            if len(usable) < tp:
                findings.append(Finding("warning", "memory", f"tensor_parallel_size = {tp} but only {len(usable)} GPU(s) are present; lower tensor_parallel_size"))
            if need > free:
                findings.append(Finding("warning", "memory (case 1)", f"target ({target:.0f} GiB) plus draft ({draft_size:.0f} GiB) weights need ~{need:.0f} GiB before the KV cache, but {tp} GPU(s) offer ~{free:.0f} GiB: both must fit. Quantize the target (AWQ/GPTQ), raise tensor_parallel_size, or use a draft-free method (ngram, eagle3)"))
            else:
                findings.append(Finding("info", "memory", f"weights ~{need:.0f} GiB of ~{free:.0f} GiB usable: they fit, {free - need:.0f} GiB left for the KV cache"))

    if not profile.is_remote and method in (None, "ngram", "suffix"):
        drafts = draft_candidates(profile.model)
        if drafts:
            listed = ", ".join(f"{m} (~{b:g}B)" for m, b in drafts)
            findings.append(Finding("info", "draft", f"models here with this model's vocabulary (the tokens compared, not the names), smaller: {listed}; try one as method = \"draft_model\" and compare with `termchat bench`"))

    if not spec:
        findings.append(Finding("info", "speculation", "this profile does not speculate; add [profiles.NAME.speculative] with method = \"suffix\" (no draft model needed) to try it"))
        return findings

    # temperature (case 2)
    if profile.temperature > 0.7:
        findings.append(Finding("warning", "temperature (case 2)", f"temperature {profile.temperature:g} on a speculative profile: high temperature drops acceptance by 15-20 points. Keep it at 0.7 or below, or rely on code_temperature for code"))

    # sizes (case 3), GPU profiles only
    target_b = params_billion(profile.model)
    if draft and not cpu:
        draft_b = params_billion(draft)
        if target_b is not None and target_b < 30:
            findings.append(Finding("warning", "target size (case 3)", f"the target has ~{target_b:g}B parameters: under ~30B a GPU is rarely memory-bound enough for a draft model to pay. Measure with `termchat bench`, or try ngram/eagle3"))
        if target_b and draft_b and draft_b > 0.12 * target_b:  # "~10%": the article's 8B-for-70B (11%) passes
            findings.append(Finding("warning", "draft size (case 3)", f"the draft (~{draft_b:g}B) is {draft_b / target_b:.0%} of the target (~{target_b:g}B): above ~10% it costs too much per step. Pick a smaller draft of the same family"))

    # vocabulary
    if draft and not spec.options.get("use_heterogeneous_vocab"):
        a, b = vocab_size(profile.model), vocab_size(draft)
        fa, fb = family(profile.model), family(draft)
        va, vb = vocabulary(profile.model), vocabulary(draft)
        if va and vb and va != vb:
            findings.append(Finding("warning", "vocabulary", "the target's and the draft's tokenizers differ (their tokens and ids compared): drafts cannot be verified token by token. Use a draft with the same tokenizer, or set use_heterogeneous_vocab = true"))
        elif va and vb:
            pass  # the same tokens: whatever the names or families say
        elif a and b and a != b:
            findings.append(Finding("warning", "vocabulary", f"target vocabulary {a} != draft vocabulary {b}: drafts cannot be verified token by token. Use a draft of the same family, or set use_heterogeneous_vocab = true"))
        elif fa and fb and fa != fb:
            findings.append(Finding("warning", "vocabulary", f"target family {fa} and draft family {fb} differ: their vocabularies probably do too. Use a draft of the same family, or set use_heterogeneous_vocab = true"))

    # speculative tokens: every method that proposes k at a time (suffix proposes
    # only as many as it trusts, up to k; its documentation suggests 16-32)
    k = spec.k
    if k > 7 and method != "suffix":
        findings.append(Finding("warning", "speculative tokens", f"num_speculative_tokens = {k}: past 7 the later positions are rarely accepted and each step costs more. Try 3-7 (`termchat bench --num-speculative-tokens 3,5,7,9`)"))
    return findings


def warnings_for(profile: Profile) -> list[Finding]:
    return [f for f in check(profile) if f.level == "warning"]
