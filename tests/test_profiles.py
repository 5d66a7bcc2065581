"""Config parsing and validation: every bad case gives exit 2 and file:line: key."""

from __future__ import annotations

import pytest

from termchat import cli
from termchat.profiles import DEFAULT_MODEL, load_config, parse_config
from termchat.chat.store import Store

from .conftest import ROOT

EXAMPLE = ROOT / "config.example.toml"


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_example_config_is_valid_and_has_the_required_profiles(capsys):
    code, out, _ = run(capsys, "profiles", "check", "--config", str(EXAMPLE))
    assert code == 0, out
    config = load_config(EXAMPLE)
    assert {"local", "local-draft", "llama70b-awq", "llama8b-eagle3", "team-server"} <= set(config.profiles)
    assert config.profiles["llama8b-eagle3"].method == "eagle3"
    assert config.profiles["team-server"].is_remote


def test_builtin_local_exists_without_any_file(capsys):
    config = load_config(None)
    local = config.get("local")
    assert local.model == DEFAULT_MODEL and local.method == "suffix"
    assert {"local-ngram", "local-suffix", "local-plain"} <= set(config.profiles)  # F2 compares methods out of the box
    assert config.get("local-plain").speculative is None and config.get("local-ngram").method == "ngram"
    code, out, _ = run(capsys, "profiles", "list")
    assert code == 0 and "local" in out and "ngram" in out and "suffix" in out


def test_article_profile_translates_the_vllm_08_spelling_and_dry_run_shows_it(capsys):
    profile = load_config(EXAMPLE).get("llama70b-awq")
    assert profile.speculative.vllm_config() == {"method": "draft_model", "model": "meta-llama/Llama-3.1-8B-Instruct", "num_speculative_tokens": 5}
    code, out, _ = run(capsys, "serve", "--config", str(EXAMPLE), "--profile", "llama70b-awq", "--dry-run")
    assert code == 0
    assert '--speculative-config \'{"method":"draft_model","model":"meta-llama/Llama-3.1-8B-Instruct","num_speculative_tokens":5}\'' in out
    for flag in ("--tensor-parallel-size 2", "--quantization awq", "--max-model-len 8192", "--model hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"):
        assert flag in out


def test_trust_remote_code_only_when_a_profile_sets_it():
    from termchat.engine.command import server_command

    config, _ = parse_config('[profiles.a]\nmodel = "m"\n[profiles.b]\nmodel = "m"\ntrust_remote_code = true\n', "x.toml")
    assert "--trust-remote-code" not in server_command(config.profiles["a"], resolve_model=False)
    assert "--trust-remote-code" in server_command(config.profiles["b"], resolve_model=False)
    assert "--api-key" not in server_command(config.profiles["a"], resolve_model=False)


def test_legacy_ngram_spelling(tmp_path):
    text = '[profiles.p]\nmodel = "m"\nspeculative_model = "[ngram]"\nnum_speculative_tokens = 4\nngram_prompt_lookup_max = 3\n'
    config, problems = parse_config(text, "x.toml")
    assert not problems
    assert config.profiles["p"].speculative.vllm_config() == {"method": "ngram", "prompt_lookup_max": 3, "num_speculative_tokens": 4}


BAD = {
    "syntax": ('[profiles.a]\nmodel = "m"\ntemperature = = 1\n', 3, "TOML syntax error"),
    "unknown key": ('[profiles.a]\nmodel = "m"\n\ntemprature = 0.5\n', 4, "profiles.a.temprature: unknown key (did you mean 'temperature'?)"),
    "wrong type": ('[profiles.a]\nmodel = "m"\nmax_tokens = "lots"\n', 3, "profiles.a.max_tokens: must be an integer"),
    "temperature range": ('[profiles.a]\nmodel = "m"\ntemperature = 2.5\n', 3, "profiles.a.temperature: 2.5 is out of range"),
    "k < 1": ('[profiles.a]\nmodel = "m"\n[profiles.a.speculative]\nmethod = "ngram"\nnum_speculative_tokens = 0\n', 5, "profiles.a.speculative.num_speculative_tokens: 0 is out of range"),
    "draft without model": ('[profiles.a]\nmodel = "m"\n\n[profiles.a.speculative]\nmethod = "draft_model"\nnum_speculative_tokens = 5\n', 4, "profiles.a.speculative.model: method 'draft_model' needs a draft `model`"),
    "unknown method": ('[profiles.a]\nmodel = "m"\n[profiles.a.speculative]\nmethod = "eagel3"\nnum_speculative_tokens = 5\n', 4, "did you mean 'eagle3'?"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_config_exit_2_with_file_line_and_key(case, tmp_path, capsys):
    text, line, message = BAD[case]
    path = tmp_path / "config.toml"
    path.write_text(text)
    code, _, err = run(capsys, "profiles", "check", "--config", str(path))
    assert code == 2
    assert f"{path}:{line}: " in err
    assert message in err
    # every other command that reads the config refuses it the same way, without a traceback
    for argv in (["ask", "--config", str(path), "hi"], ["profiles", "list", "--config", str(path)], ["serve", "--dry-run", "--config", str(path)]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and f"{path}:{line}: " in err and "Traceback" not in err


def test_file_that_is_not_text(tmp_path, capsys):
    path = tmp_path / "config.toml"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00binary")
    code, _, err = run(capsys, "profiles", "check", "--config", str(path))
    assert code == 2 and f"{path}:1: not a text file" in err


def test_every_problem_is_listed_once(tmp_path, capsys):
    path = tmp_path / "config.toml"
    path.write_text('[profiles.a]\nmodel = 1\ntop_p = 0\n[profiles.b]\nmodle = "x"\n')
    code, _, err = run(capsys, "profiles", "check", "--config", str(path))
    assert code == 2
    assert f"{path}:2: profiles.a.model: must be a string" in err
    assert f"{path}:3: profiles.a.top_p: 0 is out of range (0, 1]" in err
    assert f"{path}:5: profiles.b.modle: unknown key (did you mean 'model'?)" in err
    assert "3 problem(s)" in err


def test_lookup_order(tmp_path, monkeypatch):
    explicit, env, user = (tmp_path / n for n in ("explicit.toml", "env.toml", "user.toml"))
    for path, name in ((explicit, "from-explicit"), (env, "from-env"), (user, "from-user")):
        path.write_text(f'default_profile = "{name}"\n[profiles.{name}]\nmodel = "m"\n')
    config_dir = tmp_path / "home" / "config"
    config_dir.mkdir(parents=True)
    (config_dir / "config.toml").write_text(user.read_text())
    monkeypatch.setenv("TERMCHAT_HOME", str(tmp_path / "home"))
    assert load_config(None).default_profile == "from-user"
    monkeypatch.setenv("TERMCHAT_CONFIG", str(env))
    assert load_config(None).default_profile == "from-env"
    assert load_config(explicit).default_profile == "from-explicit"
    assert "local" in load_config(explicit).profiles  # the built-in default always exists


def test_unknown_profile_is_a_clear_error(capsys):
    code, _, err = run(capsys, "ask", "--profile", "locl", "hi")
    assert code == 2 and "unknown profile 'locl'" in err and "did you mean 'local'?" in err


def test_a_missing_local_model_folder_is_a_clear_error_before_any_engine_starts(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text(f'[profiles.gone]\nmodel = "{tmp_path / "no-such-model"}"\n')
    before = [c.id for c in Store().conversations()]
    code, _, err = run(capsys, "ask", "--config", str(config), "--profile", "gone", "hi")
    assert code == 2 and "no-such-model' does not exist on this machine" in err and "Fix `model` in the profile" in err
    assert "Traceback" not in err and "starting gone" not in err  # refused before launching vLLM
    assert [c.id for c in Store().conversations()] == before  # and no empty conversation left in the history


@pytest.mark.parametrize(
    "text, line, words",
    [
        ('[profiles.open]\nmodel = "m"\nengine_args = { host = "0.0.0.0" }\n', 3, "termchat sets this flag itself"),
        ('[profiles.open]\nmodel = "m"\n[profiles.open.engine_args]\nport = 8000\n"api-key" = "none"\n', 4, "termchat sets this flag itself"),
        ('[profiles."a/b"]\nmodel = "m"\n', 1, "letters, digits"),
        ('[profiles.big]\nmodel = "m"\nspeculative = { method = "ngram", num_speculative_tokens = 1000 }\n', 3, "out of range: 1 to 64"),
    ],
)
def test_profiles_that_would_open_the_engine_or_break_later_are_refused(tmp_path, capsys, text, line, words):
    config = tmp_path / "c.toml"
    config.write_text(text)
    code, _, err = run(capsys, "profiles", "check", "--config", str(config))
    assert code == 2 and f"c.toml:{line}:" in err and words in err, err


def test_a_config_nested_too_deeply_or_starting_with_a_bom_gets_a_clear_answer(tmp_path, capsys):
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    code, _, err = run(capsys, "profiles", "check", "--config", str(deep))
    assert code == 2 and "nests tables or arrays deeper than 32 levels" in err and "Traceback" not in err
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + b'[profiles.win]\nmodel = "m"\n')
    code, out, err = run(capsys, "profiles", "check", "--config", str(bom))
    assert code == 0, err
    assert load_config(bom).get("win").model == "m"


def test_an_endpoint_profile_without_model_leaves_the_model_to_the_server():
    config, problems = parse_config('[profiles.team]\nendpoint = "https://gpu.example/v1"\n', "c.toml")
    assert not problems and config.get("team").model == ""
