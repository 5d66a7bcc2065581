"""How close plain decoding comes to the memory-bandwidth limit.

A plain decoding step reads every weight once (a tied embedding once, as the
output layer) and the KV cache of the context so far; on a CPU a small model
is limited by those bytes over the memory bandwidth. "% of the limit" says
whether a profile is limited by memory (near 100%: only fewer bytes help) or
by overhead (well under: the scheduler, sampler, HTTP and Python cost more
than the reads). `termchat bench` prints it for each local profile.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path


def read_bandwidth() -> float:
    """Bytes per second this machine reads from memory: the best of ten sums
    of a 1 GiB tensor (torch, as many threads as the engine uses). Larger than
    any cache: on the AVX-512 VM (L3 480 MiB as reported) 16-64 MiB read at 54-56
    GB/s, 128 MiB at 45, and 256 MiB to 4 GiB at 24-29 (bench README)."""
    import time

    import torch

    data = torch.ones(256 * 1024 * 1024)
    data.sum()
    best = 0.0
    for _ in range(10):
        started = time.perf_counter()
        data.sum()
        best = max(best, data.numel() * 4 / (time.perf_counter() - started))
    return best


@dataclass
class Roofline:
    weight_bytes: int  # read once per step
    kv_bytes_per_token: int  # read per token of context, per step

    def bytes_per_step(self, context: float) -> float:
        return self.weight_bytes + self.kv_bytes_per_token * context


def for_profile(profile) -> Roofline | None:
    """The bytes a plain step of this profile reads; None for a model that is
    not a local folder with safetensors and a config.json (a remote endpoint)."""
    from termchat import models
    from termchat.engine import weights

    if profile.is_remote:
        return None
    profile = weights.applied(profile)
    try:
        folder = Path(models.resolve(profile.model))
    except Exception:  # noqa: BLE001: a hub id not prepared here
        return None
    config = models.read_config(folder)
    ggml = profile.engine_args.get("load_format") == "termchat_gguf"
    if config is None or not folder.is_dir() or not (ggml or any(folder.glob("*.safetensors"))):
        return None
    dtype = profile.dtype if profile.dtype and profile.dtype != "auto" else config.get("dtype") or config.get("torch_dtype") or "float32"
    size = models.DTYPE_BYTES.get(str(dtype), 4)  # the KV cache keeps the activations' dtype
    if ggml:
        weights = models.gguf_bytes_per_token(folder)
    else:
        weights = models.bytes_per_token(models.weight_counts(folder), str(dtype), profile.engine_args.get("quantization"))
    if weights is None:  # a quantization whose bytes termchat does not know: no roofline, not a wrong one
        return None
    return Roofline(int(weights), models.kv_bytes_per_token(config, size))


def report(profile, samples, bandwidth: float) -> str | None:
    """One line: plain decoding's read rate against the measured bandwidth."""
    roof = for_profile(profile)
    plain = [s.stats for s in samples if not s.speculative and s.stats.decode_tokens_per_s]
    if roof is None or not plain:
        return None
    tps = statistics.median(s.decode_tokens_per_s for s in plain)
    context = statistics.median((s.prompt_tokens or 0) + s.output_tokens / 2 for s in plain)  # the mean context of a reply's steps
    per_step = roof.bytes_per_step(context)
    return (
        f"{profile.name}: plain decoding {tps:.1f} tok/s x {per_step / 1e6:.0f} MB read per step "
        f"({roof.weight_bytes / 1e6:.0f} MB weights + KV cache of ~{context:.0f} tokens) = {tps * per_step / 1e9:.1f} GB/s "
        f"of {bandwidth / 1e9:.1f} GB/s measured: {tps * per_step / bandwidth:.0%} of the limit ({bandwidth / per_step:.0f} tok/s)"
    )
