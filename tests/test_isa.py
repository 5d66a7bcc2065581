"""`TERMCHAT_CPU_ISA=avx2` (vllm_ext/isa.py): on a machine with AVX-512, every
layer takes its AVX2 code, so the AVX2 kind's figures can be measured here.
Each check runs in a process of its own, as the setting is read at import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from termchat.vllm_ext import isa


def run(code: str, avx2: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k not in (isa.ENV, "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "VLLM_CACHE_ROOT")}
    if avx2:
        env[isa.ENV] = "avx2"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_visible_hides_only_what_an_avx2_cpu_lacks(monkeypatch):
    flags = {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_int8", "avx_vnni"}
    monkeypatch.delenv(isa.ENV, raising=False)
    assert isa.visible(flags) == flags
    monkeypatch.setenv(isa.ENV, "avx2")
    assert isa.visible(flags) == {"sse4_2", "avx", "avx2", "fma", "f16c"}
    assert isa.visible(sorted(flags)) == ["avx", "avx2", "f16c", "fma", "sse4_2"]  # a list stays a list
    monkeypatch.setenv(isa.ENV, "avx512")  # not a kind it emulates: the CPU as it is
    assert isa.visible(flags) == flags


def test_the_cpu_flags_termchat_reads_follow_the_setting(monkeypatch):
    from termchat.engine import proc

    monkeypatch.delenv(isa.ENV, raising=False)
    native = proc.cpu_flags()
    if "avx2" not in native:
        pytest.skip("this CPU has no AVX2")
    monkeypatch.setenv(isa.ENV, "avx2")
    seen = proc.cpu_flags()
    assert "avx2" in seen and not any(f.startswith(("avx512", "amx")) for f in seen)
    assert seen == {f for f in native if not f.startswith(isa.HIDDEN)}


def test_the_operator_is_built_for_avx2_in_a_folder_of_its_own():
    code = "from termchat.vllm_ext import build; print(build.OUT.name)"
    assert run(code, avx2=False) == "termchat-ggml"
    assert run(code, avx2=True) == "termchat-ggml-avx2"


def test_torch_and_vllm_take_their_avx2_code_and_the_machine_line_says_so():
    code = ("from termchat.vllm_ext import isa; isa.emulate(); import os, torch; "
            "print(torch.backends.cpu.get_cpu_capability(), torch.cpu._is_avx512_supported(), torch.cpu._is_amx_tile_supported(), "
            "os.environ['ONEDNN_MAX_CPU_ISA'], os.environ['VLLM_CACHE_ROOT'].endswith('isa-avx2')); "
            "from termchat.bench.command import machine_line; print(machine_line())")
    checks, line = run(code, avx2=True).splitlines()
    assert tuple(checks.split()) == ("AVX2", "False", "False", "AVX2", "True")  # capability, avx512, amx, oneDNN, cache
    assert "AVX2 code only" in line and "avx512" not in line.lower()
    assert "AVX2 code only" not in run("from termchat.bench.command import machine_line; print(machine_line())", avx2=False)
