"""One short real bench run: two prompts, one run each, two profiles sharing one baseline."""

from __future__ import annotations

import json

import pytest

from termchat import cli
from termchat.profiles import measured as results

pytestmark = pytest.mark.engine


def test_short_real_run_compares_profiles_on_one_baseline_and_remembers_the_speedups(prepared_model, tmp_path, capsys):
    report = tmp_path / "bench.json"
    markdown = tmp_path / "bench.md"
    code = cli.main(["bench", "--profile", "local,local-plain", "--runs", "1", "--limit", "1", "--categories", "code,chat", "--max-tokens", "32", "--json", str(report), "--markdown", str(markdown)])
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads(report.read_text())
    categories = {c["category"]: c for c in data["profiles"]["local"]["conditions"][0]["categories"]}
    assert set(categories) == {"code", "chat"}
    for result in categories.values():
        assert result["spec_tps"][1] > 0 and result["base_tps"][1] > 0 and result["speedup"] > 0
        assert result["acceptance"] is not None and 0 <= result["acceptance"] <= 1
        assert result["mean_acceptance_length"] >= 1 and result["tokens_per_step"] >= 1
        assert result["step_cost"] > 0
        assert result["verdict"]
    # the plain profile is the baseline itself, measured once for both profiles
    plain = data["profiles"]["local-plain"]["conditions"][0]["categories"]
    assert all(c["speedup"] == pytest.approx(1.0) and c["acceptance"] is None for c in plain)
    local_samples, plain_samples = data["samples"]["local"]["T=auto"], data["samples"]["local-plain"]["T=auto"]
    assert [s for s in local_samples if not s["speculative"]] == plain_samples
    assert data["machine"]["cores"] >= 1
    assert "speed-up" in out and "local-plain" in out and "| category |" in markdown.read_text()
    assert set(results.remembered("local")) == {"code", "chat"} and results.step_cost("local") > 0


@pytest.mark.parametrize("args, words", [
    (["--nice", "0,x"], "--nice takes whole numbers"),
    (["--nice", "20"], "--nice takes distinct values from 0 to 19"),
    (["--nice", "5,5"], "--nice takes distinct values"),
    (["--prompts", "0"], "--prompts takes 1 to 20"),
    (["--category", "chat"], "invalid choice"),
])
def test_bench_tui_refuses_bad_arguments_in_one_line(args, words, capsys):
    from termchat.bench import tui

    with pytest.raises(SystemExit) as raised:
        tui.main(args)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
