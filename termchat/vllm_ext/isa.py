"""Run as on an AVX2-only CPU, on a machine that has more: the AVX2 kind's
figures for the benchmarks when no such machine is at hand.

`TERMCHAT_CPU_ISA=avx2` in the environment of the process that starts the
engine (a bench, `termchat`) makes every layer take its AVX2 code:
- termchat itself sees the CPU's flags without AVX-512, AMX or AVX-VNNI
  (`visible`), so `weights = "auto"`, the bench's machine line and the
  operator's build follow;
- the ggml operator is built for AVX2 (build.py, its own folder beside the
  native build);
- torch's kernels and inductor's generated code (ATEN_CPU_CAPABILITY), oneDNN
  (ONEDNN_MAX_CPU_ISA) and vLLM's own kernels (its _C_AVX2 library, chosen by
  torch's CPU checks) likewise; vLLM compiles into a cache of its own, since
  its compile cache does not key on the ISA.

What it cannot change is the machine: caches, memory bandwidth and clock stay
this CPU's. Figures from it say so (the bench's machine line). Nothing here
imports the rest of termchat."""

from __future__ import annotations

import os

ENV = "TERMCHAT_CPU_ISA"
HIDDEN = ("avx512", "amx", "avx_vnni")  # flag prefixes an AVX2-only CPU lacks


def avx2_only() -> bool:
    return os.environ.get(ENV, "").strip().lower() == "avx2"


def visible(flags):
    """The CPU's flags as the code should see them."""
    return type(flags)(f for f in flags if not f.startswith(HIDDEN)) if avx2_only() else flags


def emulate() -> None:
    """In the engine's process, before torch or vLLM are imported: their AVX2
    code. With fork, the engine core inherits it; the plugin calls this again
    in a process of its own."""
    if not avx2_only():
        return
    os.environ["ATEN_CPU_CAPABILITY"] = "avx2"
    os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm")
    os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(cache, "isa-avx2"))
    import torch

    for name in ("_is_avx512_supported", "_is_avx512_vnni_supported", "_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported"):
        if hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda: False)
