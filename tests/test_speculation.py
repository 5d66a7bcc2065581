"""Speculation must be lossless, and a draft equal to the target accepts everything.

These need engines configured differently from the shared one, so this module
starts them itself, one at a time, and checks that stopping leaves nothing.
"""

from __future__ import annotations

import pytest

from termchat.engine import server
from termchat.engine.client import Sampling, complete_sync
from termchat.profiles import builtin_profiles, load_config

from .conftest import ROOT, group_alive, vllm_processes

pytestmark = pytest.mark.engine

PROMPTS = [
    "Rewrite this function with a docstring:\n\ndef area(w, h):\n    return w * h\n",
    "List three colours.",
]


@pytest.fixture(scope="module")
def nospec_engine(prepared_model):
    engine = server.open_engine(builtin_profiles()["local"].without_speculation(), attach=False)
    yield engine
    engine.stop()


def test_greedy_output_is_identical_with_and_without_speculation(shared_engine, nospec_engine):
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        with_spec = complete_sync(shared_engine, messages, Sampling(temperature=0.0, max_tokens=64))
        without = complete_sync(nospec_engine, messages, Sampling(temperature=0.0, max_tokens=64))
        assert without.stats.acceptance_rate is None
        assert with_spec.text == without.text


def test_stopping_an_engine_leaves_no_process(nospec_engine):
    pgid, port = nospec_engine.pid, nospec_engine.base_url.split(":")[-1].split("/")[0]
    assert group_alive(pgid)
    nospec_engine.stop()
    assert group_alive(pgid) == []
    assert not [p for p in vllm_processes() if f"--port {port}" in p]


def test_draft_equal_to_target_accepts_everything_at_temperature_0(prepared_model):
    profile = load_config(ROOT / "config.example.toml").get("local-draft")
    engine = server.open_engine(profile, attach=False)
    try:
        stream = complete_sync(engine, [{"role": "user", "content": "Explain what a linked list is."}], Sampling(temperature=0.0, max_tokens=96))
    finally:
        engine.stop()
    assert stream.stats.acceptance_source == "server"
    assert stream.stats.acceptance_rate >= 0.95, stream.stats.summary()
    assert group_alive(engine.pid) == []
