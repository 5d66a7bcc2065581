"""bench.replay: suffix decoding replayed offline counts the real engine's steps."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from termchat.bench import replay
from termchat.engine.client import Sampling, complete_sync

# A reply that mostly copies its prompt: suffix decoding drafts long runs of it,
# so a replay that judged drafts wrongly would be many steps off.
COPY = (
    "Repeat this list exactly, one item a line, then stop:\n"
    "apples, pears, plums, cherries, lemons, limes, oranges, grapes, melons, figs, dates, kiwis"
)


def test_the_replay_takes_the_steps_the_speculative_engine_took(shared_engine):
    messages = [{"role": "user", "content": COPY}]
    stream = complete_sync(shared_engine, messages, Sampling(temperature=0.0, max_tokens=80))
    stats = stream.stats
    assert stats.acceptance_source == "server" and stats.accepted_tokens is not None, stats.unknown
    reply = [t for step in stream.steps for t in step.token_ids]
    assert len(reply) == stats.output_tokens
    # the engine's own counts (the stream may merge steps under load; these do not):
    # each decode step gives one token and the drafts it accepts
    engine_steps = stats.output_tokens - 1 - stats.accepted_tokens
    assert engine_steps < 0.7 * len(reply), "the engine's drafts were hardly accepted: this prompt tests nothing"
    (steps,) = replay.replay([(replay.prompt_ids(messages), reply)], k=16)
    assert all(0 <= accepted <= drafted <= 16 for drafted, accepted in steps)
    # The shared engine's cache also holds the session's earlier replies, which may
    # lend it a draft the replay's fresh cache lacks: a step or two either way.
    close = max(2, engine_steps // 10)
    assert abs(len(steps) - engine_steps) <= close, (len(steps), engine_steps, stats)


def test_a_draft_scored_below_the_floor_is_not_verified():
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]
    reply = [7, 8, 9, 5, 6, 7, 8, 9, 1, 2]
    (all_drafts,) = replay.replay([(prompt, reply)], k=8)
    (none,) = replay.replay([(prompt, reply)], k=8, min_score=1000)
    assert any(drafted for drafted, _ in all_drafts) and sum(a for _, a in all_drafts) > 0
    assert none == [(0, 0)] * (len(reply) - 1)  # one token a step, as a plain engine
    assert len(all_drafts) < len(none)


def test_row_costs_interpolate_and_refuse_nonsense():
    cost = replay.row_costs("1:1,3:1.4,17:3")
    assert cost(1) == 1 and cost(2) == pytest.approx(1.2) and cost(17) == 3 and cost(40) == 3
    for bad in ("2:1.2", "1:1,2:x", "1:1,2:-1", "1:1,2:nan", "1:1,1:2", ""):
        with pytest.raises(SystemExit):
            replay.row_costs(bad)


def test_summary_projects_tokens_over_the_steps_costs():
    cost = replay.row_costs("1:1,2:1.5")
    s = replay.summary([[(1, 1), (1, 0), (0, 0)]], cost)  # 2 + 1 + 1 tokens for 1.5 + 1.5 + 1 plain steps
    assert s["speedup"] == pytest.approx(4 / 4.0) and s["tokens_per_step"] == pytest.approx(4 / 3) and s["acceptance"] == pytest.approx(0.5)


def test_ngram_replays_vllms_prompt_lookup():
    # In a process of its own: vLLM's ngram module loads numba, whose objects then
    # break vLLM's kernel registration (dispatcher._rebind_kernels scans every
    # module) in the tests that follow in this process.
    script = (
        "import json; from termchat.bench import replay\n"
        "print(json.dumps([replay.replay([([1, 2, 3, 4, 5, 1, 2, 3], [4, 5, 9])], k=3, method='ngram'),\n"
        "                  replay.replay([([1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9])], k=3, method='ngram')]))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    copied, new = json.loads(done.stdout.strip().splitlines()[-1])
    assert copied == [[[3, 1]]]  # after "3 4" the prompt goes on "5 1 2": drafted, and the reply takes "5" only
    assert new == [[[0, 0], [0, 0]]]  # "3 7" and "7 8" are nowhere before: no draft
    with pytest.raises(ValueError):
        replay.replay([([1], [2])], k=1, method="eagle")
