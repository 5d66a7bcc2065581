"""Statistics arithmetic on fixed steps (no engine needed for arithmetic)."""

from termchat.engine.stats import ReplyStats, Step, compute, per_position_from_histogram


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


def test_tokens_merged_into_the_first_chunk_are_not_timed_as_decoded_after_it():
    # beside a busy process the API server fell behind and sent 127 tokens in its first chunk,
    # the last one 10 ms later: the bench printed 11,869.9 tok/s for a reply decoded at 0.6
    steps = [Step("x" * 127, tuple(range(127)), 200.0), Step("y", (127,), 200.01)]
    stats = compute(steps, started=0.0, k=None)
    assert stats.output_tokens == 128
    assert abs(stats.decode_tokens_per_s - 1 / 0.01) < 1e-6  # the one token timed after the first chunk
    one_chunk = compute([Step("x" * 64, tuple(range(64)), 5.0)], started=0.0, k=None)
    assert one_chunk.decode_tokens_per_s is None  # nothing was timed after the first chunk: unknown


def test_merged_steps_leave_acceptance_and_steps_unknown():
    # k = 3: one step gives at most 4 tokens, so a chunk of 9 is several steps merged
    steps = [Step("", (1,), 0.2), Step("", (2, 3), 0.3), Step("", tuple(range(4, 13)), 0.9), Step("", (13,), 1.0)]
    stats = compute(steps, started=0.0, k=3)
    assert stats.acceptance_rate is None and stats.mean_acceptance_length is None
    assert "merged" in stats.unknown and stats.tokens_per_step is None
    assert "acceptance ?" in stats.short()
    assert stats.output_tokens == 13 and abs(stats.decode_tokens_per_s - 12 / 0.8) < 1e-9


def test_the_engines_own_decode_time_wins_and_is_checked():
    # 64 tokens that reached a starved client in two chunks 13 ms apart (the bench printed
    # 4,736 tok/s); the engine decoded the 63 after the first in 0.9 s
    steps = [Step("a", (1,), 30.0), Step("b" * 63, tuple(range(2, 65)), 30.013)]
    stats = compute(steps, started=0.0, k=None, generation_ms=900.0)
    assert stats.decode_source == "server" and abs(stats.decode_tokens_per_s - 63 / 0.9) < 1e-9 and stats.decode_s == 0.9
    # not a time: NaN, a string, a bool, negative, longer than the reply took, or a rate past belief
    for bad in (float("nan"), "900", True, -5.0, 31_500.0, 1e-6):
        wrong = compute(steps, started=0.0, k=None, generation_ms=bad)
        assert wrong.decode_source == "client" and abs(wrong.decode_tokens_per_s - 63 / 0.013) < 1e-6, bad
    assert ReplyStats.from_dict(stats.to_dict()).decode_source == "server"


def test_a_reply_in_chunks_of_several_tokens_counts_each_token_as_a_step_without_speculation():
    steps = [Step("a", (1,), 0.1), Step("bcdef", (2, 3, 4, 5, 6), 0.2), Step("gh", (7, 8), 0.3)]
    assert compute(steps, started=0.0, k=None).steps == 3  # a chunk a step: what the stream showed
    chunked = compute(steps, started=0.0, k=None, chunk_tokens=5)
    assert chunked.steps == chunked.output_tokens == 8 and chunked.tokens_per_step == 1.0
    assert chunked.acceptance_rate is None and chunked.mean_acceptance_length is None


def test_a_reply_comes_in_chunks_only_from_a_measured_engine_of_termchats_without_speculation():
    from dataclasses import replace

    from termchat.engine.client import ChatStream, Sampling, chunk_tokens
    from termchat.engine.endpoint import Engine
    from termchat.profiles import builtin_profiles

    local = builtin_profiles()["local"]
    plain = Engine(local.without_speculation(), "http://127.0.0.1:1/v1", None, "m")
    assert chunk_tokens(plain) == 1  # its speed is not known yet
    for rate, tokens in ((10.0, 1), (39.0, 1), (40.0, 2), (100.0, 5), (250.0, 8), (5000.0, 8)):
        plain.decode_rate = rate
        assert chunk_tokens(plain) == tokens, rate  # what it decodes in 50 ms, at most 8
    speculative = Engine(local, "http://127.0.0.1:1/v1", None, "m", decode_rate=500.0)
    remote = Engine(replace(local.without_speculation(), endpoint="http://gpu:8000/v1"), "http://gpu:8000/v1", None, "m", decode_rate=500.0)
    assert chunk_tokens(speculative) == 1 and chunk_tokens(remote) == 1
    greedy = Sampling(temperature=0.0)
    assert ChatStream(plain, [], greedy).body()["stream_interval"] == 8
    assert "stream_interval" not in ChatStream(speculative, [], greedy).body()
    assert "stream_interval" not in ChatStream(remote, [], greedy).body()
