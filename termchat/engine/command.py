"""The vLLM server command line for a profile (what `termchat serve --dry-run` prints)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from termchat import models
from termchat.profiles import Profile

SERVER_MODULE = "termchat.engine.guarded_server"  # vLLM's server, after checking its final arguments


def owned(profile: Profile, port: int | str, model: str) -> dict:
    """What termchat sets and a profile may not change (guarded_server.py checks it)."""
    return {"host": "127.0.0.1", "port": port, "uds": None, "api_key": None, "ssl_keyfile": None, "ssl_certfile": None, "ssl_ca_certs": None, "root_path": None, "headless": False, "model": model, "served_model_name": [profile.model]}


def flag(key: str, value) -> list[str]:
    name = "--" + key.replace("_", "-")
    if value is True:
        return [name]
    if value is False:
        return ["--no-" + key.replace("_", "-")]
    if isinstance(value, (dict, list)):
        return [name, json.dumps(value)]
    return [name, str(value)]


def server_command(profile: Profile, port: int | str = "PORT", resolve_model: bool = True) -> list[str]:
    """The exact command line that starts vLLM's server for a profile.

    The API key goes in the environment (VLLM_API_KEY), not on the command
    line, where any local user could read it with `ps`."""
    from termchat.engine import weights

    profile = weights.applied(profile)  # `weights = ...`: its dtype and quantization
    model = models.resolve(profile.model) if resolve_model else profile.model
    if resolve_model and profile.engine_args.get("kv_cache_memory_bytes") == "auto":
        spec = profile.speculative
        drafts = (models.resolve(spec.model),) if spec and spec.model and spec.model.startswith("termchat:") else ()
        context, kv = kv_cache_bytes(model, profile.max_model_len, dtype=profile.dtype, drafts=drafts,
                                     block_size=models.positive(profile.engine_args.get("block_size"), CPU_BLOCK))
        profile = replace(profile, max_model_len=context, engine_args={**profile.engine_args, "kv_cache_memory_bytes": kv})
    cmd = [sys.executable, "-m", SERVER_MODULE, "--model", model, "--served-model-name", profile.model]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    for key in ("tokenizer", "dtype", "max_model_len", "tensor_parallel_size", "quantization", "gpu_memory_utilization"):
        value = getattr(profile, key)
        if value is not None:
            cmd += flag(key, value)
    if profile.trust_remote_code:
        cmd.append("--trust-remote-code")
    if profile.speculative:
        spec = profile.speculative.vllm_config(models.resolve if resolve_model else None)
        cmd += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
        # per-request acceptance figures in the last streamed chunk (vLLM refuses
        # the flag when speculation is off)
        cmd += ["--per-request-spec-decode-metrics", "summary"]
    if not profile.engine_args.get("disable_log_stats"):
        # the engine's own first-to-last-token time in the last streamed chunk: a client or API
        # server that falls behind (a busy machine) gets steps late and merged, and its clock
        # then measures the delivery, not the decode (stats.compute)
        cmd.append("--enable-per-request-metrics")
    for key, value in profile.engine_args.items():
        cmd += flag(key, value)
    return cmd


KV_MIN = 256 << 20
KV_STEP = 64 << 20
CPU_BLOCK = 128  # tokens per KV block of vLLM's CPU attention (platforms/cpu.py), unless engine_args set block_size


def kv_cache_bytes(folder: str, max_model_len: int | None, *, dtype: str | None = None, block_size: int = CPU_BLOCK,
                   drafts: tuple[str, ...] = ()) -> tuple[int, int]:
    """`kv_cache_memory_bytes = "auto"`: (the context, its KV cache bytes):
    the profile's max_model_len, else the model's own context up to 4,096
    tokens; room for one whole context in whole blocks, plus the one block
    vLLM's pool holds back (its "null block": 1.5 GiB for exactly 4,096
    tokens of the 1.7B shape was refused as "1.45 GiB available"), for the
    model and any draft model whose folder termchat knows, at the dtype's
    size (float32 unless the profile runs 16-bit), rounded up to 64 MiB, at
    least 256 MiB. A 1.7B model at 4,096 tokens: 1.56 GiB; a 7B (8 KV heads):
    1.06 GiB; the default model: 256 MiB."""
    value_bytes = models.DTYPE_BYTES.get(str(dtype), 4)
    configs = [models.read_config(Path(f)) or {} for f in (folder, *drafts)]
    per_token = sum(models.kv_bytes_per_token(c, value_bytes) for c in configs)
    tokens = max_model_len or min(models.positive(configs[0].get("max_position_embeddings"), 4096), 4096)
    blocks = -(-tokens // block_size) + 1
    need = -(-(per_token * block_size * blocks) // KV_STEP) * KV_STEP
    return tokens, max(KV_MIN, need)
