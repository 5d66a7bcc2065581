"""`termchat models add FILE.gguf` and `termchat models found`: a GGUF file a
user has becomes `termchat:NAME`, offline, and every bad file gets one line,
exit 2 and nothing written.

The files are written here (tests/gguf_files.py), one per tensor type the
conversion reads; the packaged SmolLM2 file is the real one. The engine test
starts the real vLLM engine on an added model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests import gguf_files
from termchat import cli, models
from termchat.models import gguf_import

TYPES = list(gguf_import.TYPES)


@pytest.fixture(scope="module")
def packaged_gguf(prepared_model) -> Path:
    return models._gguf_path(quiet=True)


@pytest.fixture()
def models_home(tmp_path, monkeypatch):
    """An empty models folder of this test's own: `added/` must appear only
    when a conversion succeeds."""
    root = tmp_path / "models"
    monkeypatch.setenv("TERMCHAT_MODELS", str(root))
    return root


@pytest.fixture(scope="module")
def written(tmp_path_factory, packaged_gguf) -> dict[str, tuple[Path, dict]]:
    folder = tmp_path_factory.mktemp("gguf")
    return {kind: (folder / f"tiny-{kind}.gguf", gguf_files.write_llama(folder / f"tiny-{kind}.gguf", kind, packaged_gguf)) for kind in TYPES}


def run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


@pytest.mark.parametrize("kind", TYPES)
def test_each_listed_type_converts_to_exactly_the_weights_its_blocks_hold(kind, written, models_home, capsys):
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    path, held = written[kind]
    code, out, err = run(capsys, "models", "add", str(path), "--name", f"tiny-{kind.lower()}", "--quiet")
    assert (code, out.strip()) == (0, f'added termchat:tiny-{kind.lower()}: use it in a profile as model = "termchat:tiny-{kind.lower()}"'), err
    folder = Path(models.resolve(f"termchat:tiny-{kind.lower()}"))
    assert folder == models_home / "added" / f"tiny-{kind.lower()}"
    weights = load_file(str(folder / "model.safetensors"))
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    for gguf_name, hf_name in [*names.items(), ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"),
                               ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"), ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight"),
                               ("blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight"), ("blk.0.attn_output.weight", "model.layers.0.self_attn.o_proj.weight"),
                               ("blk.0.ffn_gate.weight", "model.layers.0.mlp.gate_proj.weight"), ("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight"),
                               ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"), ("blk.0.ffn_norm.weight", "model.layers.0.post_attention_layernorm.weight")]:
        ours = weights[hf_name]
        assert ours.dtype == np.float32, hf_name
        if "attn_q" in gguf_name or "attn_k" in gguf_name:  # llama.cpp keeps q and k rows permuted for its rope
            ours = gguf_files.permute(ours, gguf_files.HEADS if "attn_q" in gguf_name else gguf_files.KV_HEADS)
        assert np.array_equal(ours, held[gguf_name]), (kind, gguf_name)
    assert "lm_head.weight" not in weights  # tied to the embedding, as in the file
    config = models.read_config(folder)
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]) == (256, 1, 4, 2)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    text = "def f(x):\n    return x + 1  # café"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert {p.stat().st_mode & 0o777 for p in folder.iterdir()} == {0o600} and folder.stat().st_mode & 0o777 == 0o700
    source = json.loads((folder / "termchat-source.json").read_text())
    assert source["architecture"] == "llama"
    assert source["types"] == ({kind: 8, "F32": 3} if kind != "F32" else {"F32": 11})  # 8 matrices, 3 norms


def _gguf(path: Path, architecture: str, tensors: dict) -> Path:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), architecture)
    for name, (data, raw) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=raw) if raw is not None else writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def bad_files(folder: Path, written) -> dict[str, tuple[Path, str]]:
    """name -> (file, what its one line must say)."""
    from gguf import GGMLQuantizationType

    folder.mkdir(exist_ok=True)
    text = folder / "notes.gguf"
    text.write_text("not a model\n")
    empty = folder / "empty.gguf"
    empty.write_bytes(b"")
    cut = folder / "cut.gguf"
    whole = written["Q4_0"][0].read_bytes()
    cut.write_bytes(whole[: len(whole) * 2 // 3])
    header_only = folder / "header-cut.gguf"
    header_only.write_bytes(whole[:200])
    bert = _gguf(folder / "bert.gguf", "bert", {"token_embd.weight": (np.zeros((8, 32), np.float32), None)})
    iq = _gguf(folder / "iq2.gguf", "llama", {"blk.0.attn_q.weight": (np.zeros((256, 66), np.uint8), GGMLQuantizationType.IQ2_XXS)})
    return {
        "a text file": (text, "not a GGUF file (it starts with b'not '"),
        "an empty file": (empty, "not a GGUF file"),
        "a cut file": (cut, "truncated or damaged GGUF file (ValueError: cannot reshape array"),
        "a file cut in its header": (header_only, "truncated or damaged GGUF file"),
        "another architecture": (bert, "architecture 'bert' is not one termchat can convert"),
        "an unknown quant type": (iq, "tensor blk.0.attn_q.weight is of type IQ2_XXS, which termchat cannot convert"),
        "a missing file": (folder / "nowhere.gguf", "no such file"),
    }


def test_every_bad_file_gets_one_line_exit_2_and_nothing_written(tmp_path, written, models_home, capsys):
    for what, (path, message) in bad_files(tmp_path / "bad", written).items():
        code, out, err = run(capsys, "models", "add", str(path), "--name", "bad")
        assert code == 2 and out == "", what
        assert err.count("\n") == 1 and err.startswith(f"termchat: {path}: ") and message in err, (what, err)
        assert not models_home.exists(), (what, tree(models_home))  # not even the folder


def test_a_full_disk_is_one_line_before_writing_and_leaves_nothing_when_it_fills_midway(written, models_home, capsys, monkeypatch):
    """Fault injection (a disk cannot be filled on purpose here): the free-space
    check reads a full disk, then a disk that fills while the safetensors are written."""
    path = written["Q8_0"][0]
    Usage = type(shutil.disk_usage("/"))
    monkeypatch.setattr(gguf_import.shutil, "disk_usage", lambda p: Usage(10**12, 10**12 - 10**6, 10**6))
    code, _, err = run(capsys, "models", "add", str(path), "--name", "full")
    assert code == 2 and err.count("\n") == 1 and "which has 0.0 GB free; free some space" in err, err
    assert not models_home.exists()
    monkeypatch.undo()
    monkeypatch.setenv("TERMCHAT_MODELS", str(models_home))

    from transformers import PreTrainedModel

    def fill_up(self, folder, **kwargs):
        (Path(folder) / "model.safetensors").write_bytes(b"\0" * 4096)  # a part written, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", fill_up)
    code, _, err = run(capsys, "models", "add", str(path), "--name", "full", "--quiet")
    assert code == 2 and err.count("\n") == 1 and "filled up while converting; nothing was kept" in err, err
    assert tree(models_home) == ["added"]  # the private folder for added models, empty: no half model, no temporary folder
    assert models.added_names() == []


def test_names_are_checked_and_an_added_model_is_listed_used_and_removed(written, models_home, capsys):
    path = written["Q4_1"][0]
    for name, message in (("../etc", "is not a model name termchat makes"), ("smollm2-135m-instruct", "is the packaged model's name")):
        code, _, err = run(capsys, "models", "add", str(path), "--name", name)
        assert code == 2 and message in err, err
    assert not models_home.exists()
    assert run(capsys, "models", "add", str(path), "--quiet")[0] == 0  # named after the file
    assert models.added_names() == ["termchat:tiny-q4_1"]
    code, _, err = run(capsys, "models", "add", str(path), "--quiet")
    assert code == 2 and "termchat:tiny-q4_1 exists already" in err
    code, out, _ = run(capsys, "models", "list")
    assert f"termchat:tiny-q4_1\n  added from {path} (llama)\n  {models_home / 'added' / 'tiny-q4_1'}\n  prepared" in out
    with pytest.raises(Exception, match="unknown model 'termchat:nope'; known: termchat:smollm2-135m-instruct, termchat:tiny-q4_1. Add a GGUF file"):
        models.resolve("termchat:nope")
    assert run(capsys, "models", "remove", "tiny-q4_1")[0] == 0
    assert models.added_names() == [] and tree(models_home) == ["added"]
    code, _, err = run(capsys, "models", "remove", "smollm2-135m-instruct")
    assert code == 2 and "is the packaged model; it is not removed" in err


def test_models_found_lists_ollama_lm_studio_and_hugging_face_files_read_only(tmp_path, written, monkeypatch, models_home, capsys):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    for key in ("OLLAMA_MODELS", "HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(key, raising=False)
    q4k, q8 = written["Q4_K"][0], written["Q8_0"][0]
    # Ollama: a blob named by its digest, the name in a manifest
    digest = "ab" * 32
    blobs = home / ".ollama/models/blobs"
    blobs.mkdir(parents=True)
    shutil.copy(q4k, blobs / f"sha256-{digest}")
    manifest = home / ".ollama/models/manifests/registry.ollama.ai/library/tiny/q4_k"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "cd" * 32},
                                               {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}"}]}))
    hostile = manifest.parent / "evil"
    hostile.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:../../../../etc/passwd"}]}))
    # LM Studio
    lms = home / ".lmstudio/models/someone/tiny-GGUF"
    lms.mkdir(parents=True)
    shutil.copy(q8, lms / "tiny-Q8_0.gguf")
    (lms / "README.md").write_text("not a model")
    # the Hugging Face cache: snapshot files are links into blobs/
    repo = home / ".cache/huggingface/hub/models--someone--tiny-GGUF"
    (repo / "blobs").mkdir(parents=True)
    shutil.copy(q8, repo / "blobs/0123")
    (repo / "snapshots/rev1").mkdir(parents=True)
    (repo / "snapshots/rev1/tiny-Q8_0.gguf").symlink_to("../../blobs/0123")
    bad = bad_files(tmp_path / "bad", written)["another architecture"][0]
    shutil.copy(bad, repo / "snapshots/rev1/bert.gguf")
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in home.rglob("*")}

    code, out, _ = run(capsys, "models", "found")
    assert code == 0
    blocks = out.strip().split("\n")
    assert "ollama: tiny:q4_k  (0.5 MB)" in blocks
    assert f"  termchat models add {blobs / ('sha256-' + digest)} --name tiny-q4_k" in blocks
    assert "lm-studio: someone/tiny-GGUF/tiny-Q8_0.gguf  (0.9 MB)" in blocks
    assert "huggingface: someone/tiny-GGUF/tiny-Q8_0.gguf  (0.9 MB)" in blocks
    assert "huggingface: someone/tiny-GGUF/bert.gguf  (0.0 MB)" in blocks
    assert "  architecture 'bert' is not one termchat can convert (it converts llama, mistral, qwen2, qwen2moe, qwen3, qwen3moe, phi3, gemma2, gemma3, starcoder2, stablelm, nemotron, falcon, gpt2)" in blocks
    assert out.count("termchat models add") == 3 and "passwd" not in out and "evil" not in out
    assert sum("llama, 0.85 M parameters, Q4_K x8, F32 x3" in line for line in blocks) == 1
    assert {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in home.rglob("*")} == before  # read-only
    assert not models_home.exists()

    # what it prints is a command that works: the Ollama blob becomes a model
    assert run(capsys, "models", "add", str(blobs / f"sha256-{digest}"), "--name", "tiny-q4_k", "--quiet")[0] == 0
    assert models.added_names() == ["termchat:tiny-q4_k"]


def test_the_packaged_gguf_added_is_the_packaged_model_and_a_profile_on_it_answers(packaged_gguf, prepared_model, models_home, capsys):
    """The real engine on `model = "termchat:smol"`, added from the packaged file:
    its weights are the packaged model's, bit for bit, and it answers (eager,
    without speculation: this tests the model, not the compile)."""
    from dataclasses import replace

    from safetensors import safe_open

    from termchat.engine.client import Sampling, complete_sync
    from termchat.engine.connect import open_engine
    from termchat.profiles import builtin_profiles

    code, out, err = run(capsys, "models", "add", str(packaged_gguf), "--name", "smol", "--quiet")
    assert code == 0, err
    added = Path(models.resolve("termchat:smol"))
    with safe_open(str(added / "model.safetensors"), "pt") as ours, safe_open(str(prepared_model / "model.safetensors"), "pt") as theirs:
        assert set(ours.keys()) == set(theirs.keys())
        for key in theirs.keys():
            assert ours.get_tensor(key).equal(theirs.get_tensor(key)), key
    base = builtin_profiles()["local"].without_speculation()
    profile = replace(base, name="added", model="termchat:smol", engine_args={**base.engine_args, "enforce_eager": True})
    engine = open_engine(profile, attach=False)
    try:
        reply = complete_sync(engine, [{"role": "user", "content": "Write a Python function that adds two numbers."}], Sampling(temperature=0.0, max_tokens=32))
    finally:
        engine.stop()
    assert reply.stats.output_tokens == 32 and "def " in reply.text

