"""Exact acceptance from servers that do not report it per reply: the
parsing, on the documented shapes (vLLM's Prometheus page, llama.cpp's
`timings`, LM Studio's `stats`). These are fixed texts standing in for those
servers' answers, not a server; the real `vllm serve` is in test_speculation.py."""

from __future__ import annotations

from termchat.engine import server_counters
from termchat.engine.client import reported_drafts
from termchat.engine.stats import compute

PAGE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {drafted}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {first}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {second}
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} {stopped}
vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} 3.0
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
"""


def page(drafts, drafted, accepted, first, second, stopped, running=0.0) -> server_counters.Counters:
    return server_counters.parse(PAGE.format(drafts=drafts, drafted=drafted, accepted=accepted, first=first, second=second, stopped=stopped, running=running))


def test_a_replys_acceptance_is_the_difference_of_the_totals():
    before, after = page(10, 50, 20, 8, 6, 4), page(30, 150, 80, 26, 20, 5)
    figures = server_counters.metrics(before, after)
    stats = compute([], 0.0, None, figures)
    assert (stats.draft_tokens, stats.accepted_tokens, stats.spec_steps) == (100, 60, 20)
    assert stats.acceptance_rate == 0.6 and stats.mean_acceptance_length == 4.0
    assert stats.acceptance_per_position == [18 / 20, 14 / 20]
    assert stats.acceptance_source == "server total"


def test_other_requests_make_the_figure_approximate():
    assert server_counters.metrics(page(10, 50, 20, 8, 6, 4, running=1), page(30, 150, 80, 26, 20, 5))["source"] == server_counters.APPROXIMATE
    assert server_counters.metrics(page(10, 50, 20, 8, 6, 4), page(30, 150, 80, 26, 20, 5, running=1))["source"] == server_counters.APPROXIMATE
    assert server_counters.metrics(page(10, 50, 20, 8, 6, 4), page(30, 150, 80, 26, 20, 6))["source"] == server_counters.APPROXIMATE


def test_a_page_without_speculation_counters_is_no_answer():
    assert server_counters.parse("vllm:num_requests_running 0\n") is None
    assert server_counters.parse("llamacpp:tokens_predicted_total 3469\n") is None
    assert server_counters.parse("<html>not found</html>") is None


def test_llama_cpp_and_lm_studio_report_a_replys_drafts_themselves():
    llama = {"choices": [{"delta": {}, "finish_reason": "stop"}], "timings": {"predicted_n": 40, "draft_n": 16, "draft_n_accepted": 14}}
    studio = {"choices": [], "stats": {"tokens_per_second": 17.9, "draft_model": "d", "total_draft_tokens_count": 40, "accepted_draft_tokens_count": 30, "rejected_draft_tokens_count": 10, "ignored_draft_tokens_count": 0}}
    studio_usage = {"choices": [], "usage": {"completion_tokens": 300, "total_draft_tokens_count": 492, "accepted_draft_tokens_count": 176}}
    assert reported_drafts(llama)["draft_acceptance_rate"] == 14 / 16
    assert reported_drafts(studio)["num_accepted_draft_tokens"] == 30
    assert reported_drafts(studio_usage)["num_draft_tokens"] == 492
    stats = compute([], 0.0, None, reported_drafts(llama))
    assert stats.acceptance_source == "server" and stats.acceptance_rate == 14 / 16
    # no speculation, or nonsense: nothing claimed
    assert reported_drafts({"timings": {"predicted_n": 40}}) is None
    assert "cannot be right" in reported_drafts({"timings": {"draft_n": 4, "draft_n_accepted": 9}})["unknown"]
    assert reported_drafts({"usage": {"completion_tokens": 3}}) is None


# ---- a hostile server's numbers: unknown, never exact, never a crash ------------------------


def test_nan_and_infinite_counters_make_the_replys_figures_unknown():
    for bad in ("NaN", "+Inf", "-Inf", "1e999", "-5"):
        before, after = page(10, 50, 20, 8, 6, 4), page(30, bad, 80, 26, 20, 5)
        stats = compute([], 0.0, None, server_counters.metrics(before, after))
        assert stats.unknown and stats.acceptance_rate is None, bad
        assert "acceptance ?" in stats.short() and "acceptance unknown" in stats.summary(), bad


def test_counters_that_went_down_mean_a_restart_and_an_unknown_figure():
    before, after = page(30, 150, 80, 26, 20, 5), page(2, 10, 5, 2, 1, 1)
    stats = compute([], 0.0, None, server_counters.metrics(before, after))
    assert stats.acceptance_rate is None and "went down" in stats.unknown
    assert "77%" not in stats.summary() and "from the server total" not in stats.summary()


def test_a_flood_of_position_labels_is_not_a_figure_and_keeps_the_line_short():
    flood = "".join(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} 1\n' for i in range(300_000))
    text = PAGE.format(drafts=30, drafted=150, accepted=80, first=26, second=20, stopped=5, running=0) + flood
    after = server_counters.parse(text)
    stats = compute([], 0.0, None, server_counters.metrics(page(10, 50, 20, 8, 6, 4), after))
    assert stats.unknown and len(stats.summary()) < 400


def test_per_request_figures_of_the_wrong_type_are_unknown():
    for figures in (
        {"draft_acceptance_rate": "high", "num_draft_tokens": 10, "num_accepted_draft_tokens": 5},
        {"draft_acceptance_rate": float("nan")},
        {"draft_acceptance_rate": 1.7},
        {"num_draft_tokens": True, "num_accepted_draft_tokens": True},
        {"acceptance_histogram": "1,2,3"},
        {"acceptance_histogram": [1, "2"]},
        {"num_accepted_draft_tokens": 10**400},
        {"per_position": [0.5] * 100_000},
        {"mean_acceptance_length": float("inf")},
    ):
        stats = compute([], 0.0, 5, figures)
        assert stats.unknown and stats.acceptance_rate is None, figures
        assert "nan%" not in stats.summary() and "acceptance ?" in stats.short(), figures
        stats.to_dict()  # storable


def test_llama_cpp_timings_with_a_bool_are_not_a_hundred_percent():
    stats = compute([], 0.0, None, reported_drafts({"timings": {"draft_n": True, "draft_n_accepted": True}}))
    assert stats.acceptance_rate is None and stats.unknown


def test_a_server_that_sends_text_only_still_gets_ttft_and_an_estimated_count():
    from termchat.engine.stats import Step

    steps = [Step("Hel", (), 1.5), Step("lo", (), 1.6), Step(" there", (), 1.8)]
    stats = compute(steps, 1.0, None)
    assert stats.output_tokens == 3 and stats.tokens_estimated
    assert stats.ttft_s == 0.5 and abs(stats.decode_tokens_per_s - 2 / 0.3) < 1e-9
    assert stats.short().startswith("~3 tokens · ~6.7 tok/s")
    exact = compute(steps, 1.0, None, usage={"completion_tokens": 7, "prompt_tokens": 4})
    assert exact.output_tokens == 7 and not exact.tokens_estimated and exact.prompt_tokens == 4
    odd = compute(steps, 1.0, None, usage={"completion_tokens": "7", "prompt_tokens": float("nan")})
    assert odd.output_tokens == 3 and odd.tokens_estimated and odd.prompt_tokens is None
