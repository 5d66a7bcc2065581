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
    assert reported_drafts({"timings": {"draft_n": 4, "draft_n_accepted": 9}}) is None
    assert reported_drafts({"usage": {"completion_tokens": 3}}) is None
