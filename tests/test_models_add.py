"""`termchat models add FILE.gguf` and `termchat models found`: a GGUF file a
user has becomes `termchat:NAME`, offline, in seconds, served as it is; it is
added only when it is whole, and every file that is not gets one line, exit
2 and nothing written.

The files are written here (tests/gguf_files.py), one per tensor type; the
packaged SmolLM2 file is the real one. The engine tests start the real vLLM
engine on added models: the tiny ones must compute what an independent numpy
forward pass computes from the same file, and the packaged file added must
answer exactly as the built-in default does.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from tests import gguf_files
from termchat import cli, models
from termchat.models import gguf_import
from termchat.vllm_ext import ggml

TYPES = list(gguf_import.MATRIX_TYPES)
needs_ggml = pytest.mark.skipif(ggml.unavailable() is not None, reason=f"{ggml.unavailable()}")


@pytest.fixture(scope="module")
def packaged_gguf(prepared_model) -> Path:
    return models._gguf_path(quiet=True)


@pytest.fixture()
def models_home(tmp_path, monkeypatch):
    """An empty models folder of this test's own: `added/` must appear only
    when an add succeeds."""
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


def snapshot(root: Path) -> dict:
    """Every file below `root` with its time and size (without recursion: the tests plant folders 1,100 deep)."""
    from termchat import limits

    return {p: (p.lstat().st_mtime_ns, p.lstat().st_size) for p in limits.walk(root, depth=40)}


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


@pytest.mark.parametrize("kind", TYPES)
def test_each_listed_type_is_added_as_it_is_with_only_its_config_and_tokenizer_written(kind, written, models_home, capsys):
    from transformers import AutoTokenizer

    path, _ = written[kind]
    before = path.stat().st_mtime_ns
    code, out, err = run(capsys, "models", "add", str(path), "--name", f"tiny-{kind.lower()}", "--quiet")
    assert (code, out.strip()) == (0, f'added termchat:tiny-{kind.lower()}: use it in a profile as model = "termchat:tiny-{kind.lower()}"'), err
    folder = Path(models.resolve(f"termchat:tiny-{kind.lower()}"))
    assert folder == models_home / "added" / f"tiny-{kind.lower()}"
    assert not list(folder.glob("*.safetensors")) and sum(f.stat().st_size for f in folder.iterdir()) < 1 << 20  # nothing copied
    assert path.stat().st_mtime_ns == before  # the user's file is read, never written
    config = models.read_config(folder)
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (256, 1, 4, 2, 64)
    assert config["tie_word_embeddings"] is True and config["architectures"] == ["LlamaForCausalLM"]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    text = "def f(x):\n    return x + 1  # café"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text and tokenizer.chat_template
    assert {p.stat().st_mode & 0o777 for p in folder.iterdir()} == {0o600} and folder.stat().st_mode & 0o777 == 0o700
    source = json.loads((folder / "termchat-source.json").read_text())
    assert source["gguf"] == str(path.resolve()) and source["architecture"] == "llama"
    assert source["types"] == ({kind: 8, "F32": 3} if kind != "F32" else {"F32": 11})  # 8 matrices, 3 norms
    assert models.is_prepared(f"termchat:tiny-{kind.lower()}") and models.gguf_file_of(folder) == path.resolve()


def _raw_gguf(path: Path, items: list[tuple[str, int, bytes]], tensors: int = 0, trailing: bytes = b"") -> Path:
    """A GGUF header written byte by byte: (key, value type, value bytes)."""
    data = b"GGUF" + struct.pack("<IQQ", 3, tensors, len(items))
    for key, kind, value in items:
        data += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + value
    path.write_bytes(data + trailing)
    return path


def bad_files(folder: Path, written, packaged: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, what its one line must say): files that are not GGUF,
    headers that run away, and models that are not whole."""
    folder.mkdir(exist_ok=True)
    text = folder / "notes.gguf"
    text.write_text("not a model\n")
    empty = folder / "empty.gguf"
    empty.write_bytes(b"")
    whole = written["Q4_0"][0].read_bytes()
    cut = folder / "cut.gguf"
    cut.write_bytes(whole[: len(whole) * 2 // 3])
    header_only = folder / "header-cut.gguf"
    header_only.write_bytes(whole[:200])
    huge = _raw_gguf(folder / "huge-array.gguf", [("a", 9, struct.pack("<IQ", 0, 1 << 62))])  # 2^62 items in 98 bytes
    deep = _raw_gguf(folder / "deep-array.gguf", [("a", 9, struct.pack("<IQ", 9, 1) * 3 + struct.pack("<IQ", 0, 0))])

    def llama(name: str, **changes) -> Path:
        gguf_files.write_llama(folder / name, "Q8_0", packaged, **changes)
        return folder / name

    nan = llama("nan-scales.gguf")
    t = __import__("termchat.vllm_ext.gguf_file", fromlist=["read"]).read(nan).tensors["blk.0.ffn_up.weight"]
    raw = bytearray(nan.read_bytes())
    raw[t.offset : t.offset + 2] = np.float16("nan").tobytes()  # the first block's scale
    nan.write_bytes(bytes(raw))
    bad_utf8 = llama("bad-token.gguf")
    raw = bytearray(bad_utf8.read_bytes())
    at = raw.index(b"<|im_start|>")
    raw[at] = 0xFF
    bad_utf8.write_bytes(bytes(raw))
    return {
        "a text file": (text, "not a GGUF file (it starts with b'not '"),
        "an empty file": (empty, "not a GGUF file"),
        "a cut file": (cut, "cut short: tensor"),
        "a file cut in its header": (header_only, "cut short or damaged"),
        "an array of 2^62 items": (huge, "is 4,611,686,018,427,387,904, over termchat's limit of 4,000,000"),
        "arrays nested deep": (deep, "arrays nested more than 2 deep"),
        "another architecture": (llama("bert.gguf", architecture="bert"), "architecture 'bert' is not one termchat serves"),
        "an architecture that lies": (llama("gpt2.gguf", architecture="gpt2"), "architecture 'gpt2' is not one termchat serves"),
        "a missing tensor": (llama("no-down.gguf", drop=("blk.0.ffn_down.weight",)), "not a whole llama model: blk.0.ffn_down.weight is missing"),
        "no layers": (llama("zero-blocks.gguf", keys={"llama.block_count": 0}), "llama.block_count is 0; a whole model has a whole number from 1"),
        "no width": (llama("zero-width.gguf", keys={"llama.embedding_length": 0}), "llama.embedding_length is 0"),
        "heads that do not divide": (llama("heads.gguf", keys={"llama.attention.head_count": 3, "llama.attention.head_count_kv": 3}), "3 attention heads do not divide the hidden size 256"),
        "no heads": (llama("no-heads.gguf", keys={"llama.attention.head_count": 0}), "llama.attention.head_count is 0"),
        "a wrong shape": (llama("shape.gguf", shapes_override={"blk.0.ffn_up.weight": (256, 256)}), "blk.0.ffn_up.weight has shape [256, 256], a llama model of this config needs [256, 512]"),
        "no vocabulary": (llama("no-tokens.gguf", keys={"tokenizer.ggml.tokens": None}), "the file has no vocabulary"),
        "a token that is not UTF-8": (bad_utf8, "is not UTF-8 text"),
        "NaN scales": (nan, "tensor blk.0.ffn_up.weight holds NaN or infinite block scales"),
        "a type termchat does not serve": (llama("iq2.gguf", kinds={"blk.0.attn_q.weight": "IQ2_XXS"}), "tensor blk.0.attn_q.weight is of type IQ2_XXS, which termchat does not serve"),
        "a whole file of two types, no context length": (llama("mixed.gguf", kinds={"blk.0.attn_q.weight": "F16"}, keys={"llama.context_length": None}), ""),
        "a missing file": (folder / "nowhere.gguf", "no such file"),
    }


def test_every_file_that_is_not_a_whole_model_gets_one_line_exit_2_and_nothing_written(tmp_path, written, packaged_gguf, models_home, capsys):
    for what, (path, message) in bad_files(tmp_path / "bad", written, packaged_gguf).items():
        if not message:  # a file that is whole after all (F16 beside Q8_0, no context length): added
            assert run(capsys, "models", "add", str(path), "--name", "mixed", "--quiet")[0] == 0, what
            assert run(capsys, "models", "remove", "mixed")[0] == 0
            continue
        code, out, err = run(capsys, "models", "add", str(path), "--name", "bad")
        assert code == 2 and out == "", what
        assert err.count("\n") == 1 and err.startswith("termchat: ") and message in err and "Traceback" not in err, (what, err)
        assert tree(models_home) in ([], ["added"]), (what, tree(models_home))  # no model, no temporary folder
        assert not (models_home / "added").exists() or not any((models_home / "added").iterdir())


def test_a_header_of_two_million_items_is_read_as_one_array(tmp_path, models_home, capsys):
    """gguf's reader took 17-20 s on it, an object per item; termchat's reads
    numeric arrays in one piece (a numpy array, not a list)."""
    from termchat.vllm_ext import gguf_file

    path = _raw_gguf(tmp_path / "big.gguf", [("general.architecture", 8, struct.pack("<Q", 5) + b"llama"), ("a", 9, struct.pack("<IQ", 0, 2_000_000) + bytes(2_000_000))])
    header = gguf_file.read(path)
    assert isinstance(header.metadata["a"], np.ndarray) and header.metadata["a"].shape == (2_000_000,)
    code, _, err = run(capsys, "models", "add", str(path), "--name", "big")
    assert code == 2 and "no tensors" in err


def test_odd_folders_get_one_line_or_work_as_their_owner_meant(tmp_path, written, monkeypatch, capsys):
    path = written["Q4_1"][0]
    as_file = tmp_path / "models-file"
    as_file.write_text("x")
    monkeypatch.setenv("TERMCHAT_MODELS", str(as_file))
    code, _, err = run(capsys, "models", "add", str(path), "--name", "t", "--quiet")
    assert code == 2 and err.count("\n") == 1 and "is a file where termchat keeps models" in err
    root = tmp_path / "models"
    root.mkdir()
    monkeypatch.setenv("TERMCHAT_MODELS", str(root))
    (root / "added").write_text("x")
    code, _, err = run(capsys, "models", "add", str(path), "--name", "t", "--quiet")
    assert code == 2 and err.count("\n") == 1 and "is a file where termchat keeps added models" in err
    (root / "added").unlink()
    bigger_disk = tmp_path / "bigger-disk"
    bigger_disk.mkdir()
    (root / "added").symlink_to(bigger_disk)  # the user's own link to a folder on a bigger disk: used
    assert run(capsys, "models", "add", str(path), "--name", "t", "--quiet")[0] == 0
    assert (bigger_disk / "t" / "config.json").is_file() and models.added_names() == ["termchat:t"]
    code, _, err = run(capsys, "models", "add", str(path), "--name", "a\nb")
    assert code == 2 and err.count("\n") == 1 and "'termchat:a\\nb' is not a model name" in err


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
    assert f"termchat:tiny-q4_1\n  added from {path.resolve()} (llama)\n  {models_home / 'added' / 'tiny-q4_1'}\n  prepared" in out
    assert f"its GGUF file, served as it is ({path.resolve()})" in out
    with pytest.raises(Exception, match="unknown model 'termchat:nope'; known: termchat:smollm2-135m-instruct, termchat:tiny-q4_1. Add a GGUF file"):
        models.resolve("termchat:nope")
    assert run(capsys, "models", "remove", "tiny-q4_1")[0] == 0
    assert models.added_names() == [] and tree(models_home) == ["added"] and path.exists()  # the GGUF file stays
    code, _, err = run(capsys, "models", "remove", "smollm2-135m-instruct")
    assert code == 2 and "is the packaged model; it is not removed" in err

def test_models_found_lists_ollama_lm_studio_and_hugging_face_files_once_each_read_only(tmp_path, written, packaged_gguf, monkeypatch, models_home, capsys, request):

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    for key in ("OLLAMA_MODELS", "HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(key, raising=False)
    q4k, q8 = written["Q4_K"][0], written["Q8_0"][0]
    # Ollama: a blob named by its digest, the name in manifests; one blob named by ten manifests
    digest = "ab" * 32
    blobs = home / ".ollama/models/blobs"
    blobs.mkdir(parents=True)
    shutil.copy(q4k, blobs / f"sha256-{digest}")
    library = home / ".ollama/models/manifests/registry.ollama.ai/library"
    for tag in ["q4_k", *[f"copy{i}" for i in range(9)]]:
        manifest = library / "tiny" / tag
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "cd" * 32},
                                                   {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}"}]}))
    (library / "tiny" / "evil").write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:../../../../etc/passwd"}]}))
    (library / "tiny" / "deep").write_text("[" * 100_000 + "]" * 100_000)  # nested 100,000 deep
    os.mkfifo(library / "tiny" / "fifo")  # never opened
    # LM Studio: a file, and folders nested 1,100 deep
    lms = home / ".lmstudio/models/someone/tiny-GGUF"
    lms.mkdir(parents=True)
    shutil.copy(q8, lms / "tiny-Q8_0.gguf")
    (lms / "README.md").write_text("not a model")
    deep = home / ".lmstudio/models"
    chain = []
    for _ in range(1100):  # one level at a time: pathlib's mkdir(parents=True) recurses, and so does shutil.rmtree
        deep = deep / "d"
        os.mkdir(deep)
        chain.append(deep)
    request.addfinalizer(lambda: [os.rmdir(d) for d in reversed(chain)])
    # the Hugging Face cache: snapshot files are links into blobs/, two snapshots of one blob
    repo = home / ".cache/huggingface/hub/models--someone--tiny-GGUF"
    (repo / "blobs").mkdir(parents=True)
    shutil.copy(q8, repo / "blobs/0123")
    for rev in ("rev1", "rev2"):
        (repo / "snapshots" / rev).mkdir(parents=True)
        (repo / "snapshots" / rev / "tiny-Q8_0.gguf").symlink_to("../../blobs/0123")
    bad = bad_files(tmp_path / "bad", written, packaged_gguf)["another architecture"][0]
    shutil.copy(bad, repo / "snapshots/rev1/bert.gguf")
    forged = repo / "snapshots/rev1" / "x.gguf\n  termchat models add forged.gguf --name x.gguf"
    shutil.copy(q8, forged)
    before = snapshot(home)

    code, out, _ = run(capsys, "models", "found")
    assert code == 0
    blocks = out.strip().split("\n")
    assert "ollama: tiny:copy0  (0.5 MB)" in blocks and sum(b.startswith("ollama:") for b in blocks) == 1  # ten names, one file
    assert f"  termchat models add {blobs / ('sha256-' + digest)} --name tiny-copy0" in blocks
    assert "lm-studio: someone/tiny-GGUF/tiny-Q8_0.gguf  (0.9 MB)" in blocks
    assert sum(b == "huggingface: someone/tiny-GGUF/tiny-Q8_0.gguf  (0.9 MB)" for b in blocks) == 1  # two snapshots linking one blob
    assert "huggingface: someone/tiny-GGUF/bert.gguf" in out
    assert "  architecture 'bert' is not one termchat serves" in out
    assert not any(line.startswith("  termchat models add forged.gguf") for line in blocks)  # a file name cannot print a line of its own
    assert "its path holds a control character or line break" in out and "evil" not in out and "passwd" not in out
    assert sum("llama, 0.85 M parameters, Q4_K x8, F32 x3" in line for line in blocks) == 1
    assert snapshot(home) == before  # read-only
    assert not models_home.exists()

    # what it prints is a command that works: the Ollama blob becomes a model
    assert run(capsys, "models", "add", str(blobs / f"sha256-{digest}"), "--name", "tiny-q4_k", "--quiet")[0] == 0
    assert models.added_names() == ["termchat:tiny-q4_k"]


def _prompt_logprobs(engine, ids: list[int]) -> list[float]:
    """The engine's log-probability of each token of `ids` after the ones before it."""
    body = {"model": engine.model_name, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
    response = engine.run(lambda: engine.client.post(engine.base_url + "/completions", json=body, timeout=120.0))
    response.raise_for_status()
    entries = response.json()["choices"][0]["prompt_logprobs"]
    return [entry[str(token)]["logprob"] for entry, token in zip(entries[1:], ids[1:])]


@needs_ggml
def test_an_engine_on_each_kind_of_block_computes_what_the_file_holds(tmp_path, packaged_gguf, models_home, capsys):
    """The real engine, on tiny added models whose matrices are Q4_0, Q4_1,
    Q8_0, and Q4_K with v and down in Q6_K (as Q4_K_M keeps them), from a
    one-line profile: the log-probability of each prompt token equals what a
    float64 numpy forward pass computes from the values the file holds,
    within what ggml's 8-bit activations change."""
    from termchat.engine.connect import open_engine
    from termchat.profiles import parse_config

    ids = [1, 57, 300, 777, 12, 901, 44, 640, 3, 1000, 250, 18, 512, 77, 2, 999]
    mix = {"blk.0.attn_v.weight": "Q6_K", "blk.0.ffn_down.weight": "Q6_K"}
    # Q4_K and Q6_K in one engine: the Q4_K_M-like mix (four engine starts, not six, for CI's half hour)
    for kind, kinds in (("Q4_0", None), ("Q4_1", None), ("Q8_0", None), ("Q4_K", mix)):
        name = f"t-{kind.lower()}" + ("-m" if kinds else "")
        path = tmp_path / f"{name}.gguf"
        held = gguf_files.write_llama(path, kind, packaged_gguf, seed=3, kinds=kinds)
        assert run(capsys, "models", "add", str(path), "--name", name, "--quiet")[0] == 0
        config, problems = parse_config(f'[profiles.p]\nmodel = "termchat:{name}"\nengine_args = {{ enforce_eager = true }}\n', "t.toml")
        assert not problems and config.get("p").weights == "auto"  # the built-ins' CPU settings, inherited
        engine = open_engine(config.get("p"), attach=False)
        try:
            log = engine.log_path.read_text(errors="replace")
            got = np.array(_prompt_logprobs(engine, ids))
        finally:
            engine.stop()
        assert "termchat_ggml" in log and "termchat_gguf" in log, name
        want = gguf_files.reference_logprobs(held, ids)[np.arange(len(ids) - 1), ids[1:]]
        off = np.abs(got - want) / np.maximum(1.0, np.abs(want))  # ggml's 8-bit activations: about 1% of a log-probability
        assert off.max() < 0.02 and off.mean() < 0.01, (name, off.max(), got, want)


@needs_ggml
def test_the_packaged_gguf_added_answers_as_the_built_in_default_does(packaged_gguf, models_home, shared_engine, capsys):
    """`model = "termchat:smol"`, added from the packaged file, on a one-line
    profile: it answers, and gives each token of its reply the log-probability
    the shared default engine (the same file's blocks on ggml, compiled) gives
    it. Not exactly: ggml quantizes each activation row to 8 bits, and the
    compiled graph's last bits move those roundings. Measured on two replies
    (bench/README.md, "Is ggml as close as llama.cpp?"): eager against compiled
    0.02 nats a token on average, at most 0.18; each against float64 0.04-0.05,
    as llama.cpp's own (0.05-0.06). A wrong layout or scale is nats off."""
    from termchat.bench.formats import continuation_tokens
    from termchat.engine.client import Sampling, complete_sync
    from termchat.engine.connect import open_engine
    from termchat.profiles import parse_config

    code, _, err = run(capsys, "models", "add", str(packaged_gguf), "--name", "smol", "--quiet")
    assert code == 0, err
    config, problems = parse_config('[profiles.smol]\nmodel = "termchat:smol"\nengine_args = { enforce_eager = true }\n', "t.toml")
    assert not problems
    prompt = "Write a Python function that adds two numbers."
    engine = open_engine(config.get("smol"), attach=False)
    try:
        reply = complete_sync(engine, [{"role": "user", "content": prompt}], Sampling(temperature=0.0, max_tokens=48))
        ids, start = engine.run(lambda: continuation_tokens(engine, prompt, reply.text))
        own = _prompt_logprobs(engine, ids)[start - 1 :]
    finally:
        engine.stop()
    default = _prompt_logprobs(shared_engine, ids)[start - 1 :]
    assert reply.stats.output_tokens == 48 and "def " in reply.text and len(own) == len(default) >= 40
    apart = [abs(a - b) for a, b in zip(own, default)]
    assert sum(apart) / len(apart) <= 0.05 and max(apart) <= 0.5, (sum(apart) / len(apart), max(apart))


def test_the_default_model_follows_the_packaged_file_into_a_new_environment(tmp_path, packaged_gguf, monkeypatch):
    """The prepared default lives under the user's cache, its GGUF file in the
    Python environment: when that environment goes (a fresh clone, a
    reinstall), the record names a file that is gone. Resolving the default
    points the record at this environment's copy, so the engine starts."""
    from termchat.vllm_ext.ggml import SOURCE_FILE

    prepared = models.folder("termchat:smollm2-135m-instruct")
    root = tmp_path / "models"
    shutil.copytree(prepared, root / prepared.name, ignore=shutil.ignore_patterns("*.safetensors"))
    monkeypatch.setenv("TERMCHAT_MODELS", str(root))
    record = root / prepared.name / SOURCE_FILE
    source = json.loads(record.read_text())
    record.write_text(json.dumps({**source, "gguf": str(tmp_path / "old-venv" / packaged_gguf.name)}))
    assert models.resolve("termchat:smollm2-135m-instruct") == str(root / prepared.name)
    assert json.loads(record.read_text())["gguf"] == str(packaged_gguf)
