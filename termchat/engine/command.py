"""The vLLM server command line for a profile (what `termchat serve --dry-run` prints)."""

from __future__ import annotations

import json
import sys

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
    for key, value in profile.engine_args.items():
        cmd += flag(key, value)
    return cmd
