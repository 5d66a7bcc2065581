"""One short real bench run: two prompts, one run each, the `local` profile."""

from __future__ import annotations

import json

import pytest

from termchat import cli

pytestmark = pytest.mark.engine


def test_short_real_run_writes_a_json_report_with_positive_statistics(prepared_model, tmp_path, capsys):
    report = tmp_path / "bench.json"
    markdown = tmp_path / "bench.md"
    code = cli.main(["bench", "--profile", "local", "--runs", "1", "--limit", "1", "--categories", "code,chat", "--max-tokens", "32", "--json", str(report), "--markdown", str(markdown)])
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads(report.read_text())
    categories = {c["category"]: c for c in data["conditions"][0]["categories"]}
    assert set(categories) == {"code", "chat"}
    for result in categories.values():
        assert result["spec_tps"][1] > 0 and result["base_tps"][1] > 0 and result["speedup"] > 0
        assert result["acceptance"] is not None and 0 <= result["acceptance"] <= 1
        assert result["mean_acceptance_length"] >= 1
        assert len(result["per_position"]) == 5
        assert result["verdict"]
    samples = data["samples"]["T=auto"]
    assert {s["speculative"] for s in samples} == {True, False}
    assert data["machine"]["cores"] >= 1
    assert "speed-up" in out and "code" in out and "| category |" in markdown.read_text()
