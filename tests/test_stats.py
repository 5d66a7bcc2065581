"""Statistics arithmetic on fixed steps (no engine needed for arithmetic)."""

from termchat.engine.stats import Step, compute, per_position_from_histogram


def test_server_metrics_win_and_per_position_comes_from_the_histogram():
    steps = [Step("a", (1,), 1.0), Step("bc", (2, 3), 1.5), Step("d", (4,), 2.0)]
    metrics = {"draft_acceptance_rate": 0.5, "mean_acceptance_length": 2.0, "num_accepted_draft_tokens": 1, "num_draft_tokens": 2, "acceptance_histogram": [1, 1, 0]}
    stats = compute(steps, started=0.5, k=2, server_metrics=metrics, usage={"completion_tokens": 4}, temperature=0.0)
    assert stats.acceptance_source == "server"
    assert stats.acceptance_rate == 0.5
    assert stats.acceptance_per_position == [0.5, 0.0]
    assert stats.ttft_s == 0.5
    assert stats.decode_tokens_per_s == 3 / 1.0  # 3 tokens after the first, over 1 s after the first


def test_derived_from_step_sizes_when_the_server_gives_nothing():
    # prefill step, then steps accepting 3, 0 and 1 drafts with k = 3
    steps = [Step("", (1,), 0.2), Step("", (1, 2, 3, 4), 0.3), Step("", (5,), 0.4), Step("", (6, 7), 0.5)]
    stats = compute(steps, started=0.0, k=3)
    assert stats.acceptance_source == "step sizes"
    assert stats.accepted_tokens == 4 and stats.draft_tokens == 9
    assert abs(stats.acceptance_rate - 4 / 9) < 1e-9
    assert abs(stats.mean_acceptance_length - (1 + 4 / 3)) < 1e-9
    assert [round(p, 3) for p in stats.acceptance_per_position] == [0.667, 0.333, 0.333]
    assert stats.output_tokens == 8


def test_no_speculation_reports_no_acceptance():
    stats = compute([Step("a", (1,), 1.0), Step("b", (2,), 2.0)], started=0.0, k=None)
    assert stats.acceptance_rate is None and stats.acceptance_source == "none"


def test_histogram_positions():
    assert per_position_from_histogram([2, 2, 0, 0, 0, 3]) == [5 / 7, 3 / 7, 3 / 7, 3 / 7, 3 / 7]
