"""`weights = "auto" | FORMAT` in a profile (engine/weights.py): the format
a profile's engine runs, forced or measured on this machine, a missing kernel
refused with its reason, and the state file checked where it enters."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from termchat import paths
from termchat.engine import proc
from termchat.engine.command import server_command
from termchat.engine import weights
from termchat.profiles import builtin_profiles, parse_config

MODEL = "termchat:smollm2-135m-instruct"


@pytest.fixture()
def clean_record(tmp_path, monkeypatch):
    monkeypatch.setattr(weights, "record_path", lambda: tmp_path / "state" / "formats.json")
    return tmp_path / "state" / "formats.json"


@pytest.fixture()
def no_ggml(monkeypatch):
    """A machine where the ggml operator was not built (its build failed, or a GPU machine)."""
    from termchat.vllm_ext import ggml

    monkeypatch.setattr(ggml, "unavailable", lambda: "the ggml operator is not built in this environment")


def local(**keys):
    return replace(builtin_profiles()["local-plain"], **keys)


def test_a_config_names_a_known_format_or_gets_the_line_that_does_not():
    text = '[profiles.a]\nmodel = "x"\nweights = "int4"\n\n[profiles.b]\nmodel = "x"\nweights = "int5"\n\n[profiles.c]\nendpoint = "http://h:1/v1"\nweights = "auto"\n'
    config, problems = parse_config(text, "c.toml")
    assert config.profiles["a"].weights == "int4"
    assert [str(p) for p in problems] == [
        "c.toml:7: profiles.b.weights: unknown weight format 'int5'; use 'auto' (this machine's measured choice) or one of float32, bfloat16, int4, int4-f32head, int4-int4head, int4-int8head, ggml",
        "c.toml:11: profiles.c.weights: chooses the format of an engine termchat starts; a remote endpoint's server chooses its own. Remove it.",
    ]


def test_a_forced_format_is_what_the_engine_runs_under_the_profiles_own_name(clean_record, monkeypatch):
    assert builtin_profiles()["local"].weights == "auto"  # the built-ins run the fastest format here
    monkeypatch.setattr(proc, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})  # a CPU that runs both formats
    cmd = server_command(local(weights="int4"), resolve_model=False)
    assert cmd[cmd.index("--quantization") + 1] == "termchat_int4" and cmd[cmd.index("--dtype") + 1] == "float32"
    cmd = server_command(local(weights="bfloat16", quantization="awq"), resolve_model=False)
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16" and "--quantization" not in cmd  # the format replaces both
    plain = server_command(local(weights=None), resolve_model=False)
    assert "--quantization" not in plain and plain[plain.index("--dtype") + 1] == "float32"  # no `weights`: as written
    cmd = server_command(local(weights="ggml"), resolve_model=False)
    assert cmd[cmd.index("--quantization") + 1] == "termchat_ggml" and cmd[cmd.index("--load-format") + 1] == "termchat_gguf"
    assert weights.applied(local(weights="int4")).name == "local-plain"


def test_auto_is_the_recorded_choice_of_this_machine_and_the_first_fallback_it_runs_when_there_is_none(clean_record, no_ggml, monkeypatch):
    monkeypatch.setattr(proc, "cpu_flags", lambda: {"avx2"})
    assert weights.choose(local(weights="auto")) == ("int4", 'weights = "auto": nothing measured on this machine yet, so int4, the first of ggml, int4, int4-int8head, int4-f32head, bfloat16, float32 this machine runs (`python -m termchat.bench.formats --record` measures them)')
    weights.record(MODEL, "int4", {"float32": 14.4, "int4": 30.1, "bfloat16": 20.0}, {"float32": True, "int4": True, "bfloat16": True}, "machine: test")
    assert clean_record.stat().st_mode & 0o777 == 0o600
    assert weights.choose(local(weights="auto")) == ("int4", 'weights = "auto": int4, measured fastest here passing the quality guard')
    assert weights.choose(replace(local(weights="auto"), model="termchat:other"))[0] == "int4"  # recorded for another model: the fallback
    line = weights.choice_line(MODEL)  # what `termchat models list` shows
    assert line.startswith('weights = "auto" here: int4, the fastest passing the quality guard (decode tok/s int4 30.1, bfloat16 20.0, float32 14.4; measured 20'), line
    assert weights.choice_line("termchat:other").startswith('weights = "auto" here: int4, nothing measured')
    weights.record(MODEL, "bfloat16", {"float32": 14.4, "bfloat16": 20.0}, {"float32": True, "bfloat16": True}, "machine: test")
    with pytest.MonkeyPatch.context() as patch:  # recorded before bfloat16 was refused on this CPU: the line says what runs
        patch.setattr(weights, "refusal", lambda fmt, model=None: "no rounding instruction here" if fmt == "bfloat16" else None)
        assert weights.choice_line(MODEL) == 'weights = "auto" here: float32 (no rounding instruction here: float32 instead)'


def test_a_record_from_another_machine_or_that_does_not_hold_up_is_not_used(clean_record, no_ggml, monkeypatch):
    monkeypatch.setattr(proc, "cpu_flags", lambda: {"sse4_2"})  # no int4 either: the fallback is float32
    weights.record(MODEL, "int4", {"float32": 14.4, "int4": 30.1}, {"float32": True, "int4": True}, "machine: test")
    data = json.loads(clean_record.read_text())
    mine = data.pop(weights.machine_key())
    data["Some Other CPU | avx2 avx512f | 64 cores"] = mine  # copied from another machine
    paths.write_private(clean_record, json.dumps(data).encode())
    assert weights.recorded(MODEL) is None
    for bad in ({"format": "int3", "tok_s": {"int3": 1.0}}, {"format": "int4", "tok_s": {"int4": float("nan")}}, {"format": "int4", "tok_s": "fast"}, ["int4"],
                {"format": "int4", "tok_s": {"int4": True}}, {"format": "int4", "tok_s": {}}, {"format": "int4", "tok_s": {"int4": 1e308}},
                {"format": ["int4"], "tok_s": {"int4": 30.0}}, {"format": {"a": 1}, "tok_s": {"int4": 30.0}}, {"format": "int4", "tok_s": {"float32": 30.0}}):
        paths.write_private(clean_record, json.dumps({weights.machine_key(): {MODEL: bad}}).encode())
        assert weights.recorded(MODEL) is None and weights.choose(local(weights="auto"))[0] == "float32", bad
    clean_record.write_bytes(b"\xff{not json")
    assert weights.choose(local(weights="auto"))[0] == "float32"


def test_a_format_whose_kernel_this_cpu_lacks_is_refused_and_the_next_fastest_taken(clean_record, no_ggml, monkeypatch):
    monkeypatch.setattr(proc, "cpu_flags", lambda: {"sse4_2"})
    monkeypatch.setattr(proc, "cpu_model", lambda: "Old CPU")
    fmt, why = weights.choose(local(weights="int4"))
    assert (fmt, why) == ("float32", "int4 needs AVX2 or AVX-512 (torch's int4 kernel has no other fast path); this CPU (Old CPU) has neither: float32 instead")
    assert weights.refusal("bfloat16").startswith("bfloat16 needs AVX512-BF16 or AMX on this CPU (Old CPU)")  # truncating kernels there
    weights.record(MODEL, "int4", {"float32": 14.4, "int4": 30.1, "int4-f32head": 25.0, "bfloat16": 12.0}, {"float32": True, "int4": True, "int4-f32head": True, "bfloat16": True}, "m")
    assert weights.choose(local(weights="auto"))[0] == "float32"  # by the record's speeds: int4-f32head refused too, bfloat16 slower than float32
    cmd = server_command(local(weights="int4"), resolve_model=False)
    assert "--quantization" not in cmd
    findings = [weights.finding(local(weights="int4"))]
    assert [(f.level, f.message) for f in findings] == [("warning", "int4 needs AVX2 or AVX-512 (torch's int4 kernel has no other fast path); this CPU (Old CPU) has neither: float32 instead")]


def test_bfloat16_is_refused_where_vllms_kernels_truncate_and_taken_where_the_cpu_rounds(clean_record, no_ggml, monkeypatch):
    monkeypatch.setattr(proc, "cpu_model", lambda: "AMD EPYC")
    monkeypatch.setattr(proc, "cpu_flags", lambda: {"avx2", "fma"})
    fmt, why = weights.choose(local(weights="bfloat16"))
    assert fmt == "int4" and "round to bfloat16 by truncation" in why and why.endswith(": int4 instead")
    monkeypatch.setattr(proc, "cpu_flags", lambda: {"avx2", "avx512f"})  # AVX-512 without its BF16 instructions truncates too
    assert weights.choose(local(weights="bfloat16"))[0] == "int4"
    monkeypatch.setattr(proc, "cpu_flags", lambda: {"avx2", "fma"})
    warned = weights.finding(local(dtype="bfloat16", weights=None))  # set as a dtype, not a format: doctor warns, nothing is changed
    assert (warned.level, warned.message.endswith('use weights = "auto" or dtype = "float32"')) == ("warning", True)
    assert weights.applied(local(dtype="bfloat16", weights=None)).dtype == "bfloat16" and weights.finding(local(weights=None)) is None
    monkeypatch.setattr(proc, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    assert weights.choose(local(weights="bfloat16")) == ("bfloat16", 'weights = "bfloat16"')
    assert weights.finding(local(dtype="bfloat16", weights=None)) is None


def test_the_guard_fails_a_variant_for_loops_only_when_they_outnumber_float32s_beyond_chance():
    from termchat.bench.formats import more_loops_than_chance

    f32 = [True] * 5 + [False] * 55
    one_more = [True] * 6 + [False] * 54  # 6 against 5 of 60: what a near-tie parts
    assert not more_loops_than_chance(one_more, f32)
    swapped = [False] * 5 + [True] * 5 + [False] * 50  # as many, on other prompts
    assert not more_loops_than_chance(swapped, f32)
    five_more = [True] * 10 + [False] * 50  # 5 extra, none fewer: p = 1/32
    assert more_loops_than_chance(five_more, f32)
    assert not more_loops_than_chance(f32, five_more)  # fewer loops never fails
    assert not more_loops_than_chance([False] * 60, [False] * 60)


def test_the_repetition_bench_pairs_each_format_with_the_first_reply_by_reply(capsys):
    from termchat.bench.repetition import print_paired

    looping = " ".join(["the sea is blue"] * 20)
    varied = "a walk in the forest in autumn, leaves falling on the path while the wind turns cold"
    # reply by reply: int4 loops where float32 does not twice, never the reverse
    results = {
        "float32, guard": [("chat", varied, "stop"), ("chat", varied, "stop"), ("chat", looping, "length")],
        "int4, guard": [("chat", looping, "length"), ("chat", looping, "length"), ("chat", looping, "length")],
    }
    print_paired(results, ["float32", "int4"], ["guard"])
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert row.startswith("| int4, guard | 2 / 0 (p 0.250) | 2 / 0 (p 0.250) |"), row


def test_the_record_s_other_fields_are_checked_where_they_enter(clean_record, no_ggml, monkeypatch):
    """A date past time's range or a guard that is a string is unknown, never a crash."""
    monkeypatch.setattr(proc, "cpu_flags", lambda: {"avx2"})
    for when in (1e17, 1e300, "yesterday"):
        entry = {"format": "int4", "tok_s": {"int4": 30.0, "float32": 14.0}, "guard": "yes", "measured_at": when}
        paths.write_private(clean_record, json.dumps({weights.machine_key(): {MODEL: entry}}).encode())
        assert weights.recorded(MODEL)["guard"] == {} and weights.recorded(MODEL)["measured_at"] is None
        assert weights.choice_line(MODEL).endswith("measured an unknown date)"), when
        assert weights.choose(local(weights="bfloat16"))[0] in ("int4", "float32")  # the guard's string is not indexed


def test_ggml_comes_first_where_its_operator_is_built_and_the_model_has_a_gguf_file(clean_record, prepared_model):
    from termchat.vllm_ext import ggml

    if ggml.unavailable():
        assert weights.refusal("ggml", MODEL) == ggml.unavailable()
        return
    assert weights.refusal("ggml", MODEL) is None and weights.choose(local(weights="auto"))[0] == "ggml"
    assert "names none" in weights.refusal("ggml", "meta-llama/Llama-3.1-8B-Instruct")  # a hub model has no GGUF file to serve


def test_a_one_line_termchat_profile_gets_the_cpu_settings_and_a_kv_cache_sized_from_its_model(tmp_path, monkeypatch, prepared_model):
    """vLLM's default takes 0.92 of the machine's memory for the KV cache (it
    refused to start with 2 GB in use elsewhere); a termchat model's profile
    runs with the built-ins' CPU engine and one context's worth of cache."""
    from termchat import models
    from termchat.engine.command import kv_cache_bytes
    from termchat.profiles import cpu_build

    if not cpu_build():
        pytest.skip("the GPU build keeps vLLM's own defaults")
    one = parse_config('[profiles.mine]\nmodel = "termchat:smollm2-135m-instruct"\n', "c.toml")[0].get("mine")
    assert one.weights == "auto" and one.env["VLLM_CPU_ATTN_SPLIT_KV"] == "0" and one.engine_args["distributed_executor_backend"] == "uni"
    assert one.system_prompt and one.text_frequency_penalty == 0.5 and one.code_temperature == 0.0
    cmd = server_command(one)
    kv = int(cmd[cmd.index("--kv-cache-memory-bytes") + 1])
    # SmolLM2-135M: 30 layers x 3 KV heads x 64 x K and V x float32 = 46,080 bytes a token; 33 blocks of 128 tokens are under 256 MiB
    assert kv == 256 << 20 and cmd[cmd.index("--max-model-len") + 1] == "4096" and "--gpu-memory-utilization" not in cmd
    folder = str(models.folder("termchat:smollm2-135m-instruct"))
    # 16,384 tokens are 128 blocks of 128, and the block vLLM's pool holds back: 46,080 x 128 x 129 = 726 MiB, up to 64 MiB steps
    assert kv_cache_bytes(folder, 16384) == (16384, 768 << 20)
    assert kv_cache_bytes(folder, 16384, dtype="bfloat16") == (16384, 384 << 20)  # 16-bit values: half
    assert kv_cache_bytes(folder, 16384, drafts=(folder,)) == (16384, 1472 << 20)  # a draft's layers take their share
    assert kv_cache_bytes(folder, 16384, block_size=16) == (16384, 768 << 20)  # 1,025 blocks of 16: 721 MiB
    own = parse_config('[profiles.mine]\nmodel = "termchat:smollm2-135m-instruct"\nmax_model_len = 2048\ntemperature = 0.3\n'
                       'engine_args = { kv_cache_memory_bytes = 1073741824 }\nenv = { X = "1" }\n', "c.toml")[0].get("mine")
    cmd = server_command(own)
    assert own.temperature == 0.3 and own.env["X"] == "1" and own.env["VLLM_CPU_ATTN_SPLIT_KV"] == "0"  # its keys win, key by key
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == "1073741824" and cmd[cmd.index("--max-model-len") + 1] == "2048"
    hub = parse_config('[profiles.hub]\nmodel = "org/name"\n', "c.toml")[0].get("hub")
    assert hub.weights is None and not hub.engine_args  # a hub model keeps vLLM's own defaults
