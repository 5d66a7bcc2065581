"""Sampling knobs: declared once on the profile, checked like every key, sent
only when set (the engine applying them is in test_repl.py and, for
losslessness with penalties, test_speculation.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from termchat.engine.client import ChatStream, Sampling
from termchat.profiles import builtin_profiles, parse_config
from termchat.chat.session import ChatSession
from termchat.errors import UserError

KNOBS = 'top_k = 40\nmin_p = 0.05\nrepetition_penalty = 1.1\npresence_penalty = 0.5\nfrequency_penalty = -0.5\nstop = ["###", "\\nUser:"]\nseed = 7\n'


def body(profile, overrides=None) -> dict:
    return ChatStream(SimpleNamespace(model_name="m"), [], Sampling(temperature=0.7, **profile.sampling(overrides))).body()


def test_a_profile_sends_its_knobs_and_leaves_unset_ones_to_the_server():
    config, problems = parse_config('[profiles.k]\nmodel = "m"\n' + KNOBS, "c.toml")
    assert not problems
    sent = body(config.get("k"))
    assert {k: sent[k] for k in ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "stop", "seed")} == {
        "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5, "stop": ["###", "\nUser:"], "seed": 7,
    }
    plain = body(builtin_profiles()["local"])
    assert not {"top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "stop", "seed"} & set(plain)


@pytest.mark.parametrize(
    "line, words",
    [
        ("repetition_penalty = 0", "out of range (0, 2]"),
        ("presence_penalty = 3", "out of range [-2, 2]"),
        ("top_k = 0", "out of range [1, 1048576]"),
        ('stop = "###"', "must be a list of strings"),
        ('stop = ["a", 1]', "list of non-empty strings"),
        ("seed = 1.5", "must be an integer"),
        ("min_p = true", "must be a number"),
    ],
)
def test_a_bad_knob_is_refused_with_its_line(line, words):
    _, problems = parse_config(f'[profiles.k]\nmodel = "m"\n{line}\n', "c.toml")
    assert len(problems) == 1 and problems[0].line == 3 and words in problems[0].message, problems


def test_set_overrides_the_profile_for_the_session_and_off_goes_back():
    profiles = builtin_profiles()
    session = ChatSession(SimpleNamespace(), profiles["local"])
    session.set_knob("repetition_penalty 1.15")
    session.set_knob('stop "END"')
    assert body(profiles["local-ngram"], session.knobs)["repetition_penalty"] == 1.15  # over every profile
    assert body(profiles["local"], session.knobs)["stop"] == ["END"]
    session.set_knob("repetition_penalty off")
    assert "repetition_penalty" not in body(profiles["local"], session.knobs)
    for bad, words in (("temperature 0.2", "/set cannot change 'temperature'"), ("top_p 0", "out of range (0, 1]"), ("top_k lots", "takes an integer")):
        with pytest.raises(UserError, match=words.replace("(", r"\(").replace("[", r"\[")):
            session.set_knob(bad)


def test_set_seed_says_in_one_line_what_the_seed_promises_on_this_profile():
    config, problems = parse_config(
        '[profiles.gpu]\nendpoint = "http://127.0.0.1:9/v1"\n'
        '[profiles.sampled-drafts]\nmodel = "m"\n[profiles.sampled-drafts.speculative]\nmethod = "draft_model"\nmodel = "m"\n'
        'num_speculative_tokens = 3\ndraft_sample_method = "probabilistic"\n', "c.toml")
    assert not problems, problems
    said = {name: ChatSession(SimpleNamespace(), profile).set_knob("seed 42") for name, profile in
            (("local", builtin_profiles()["local"]), ("gpu", config.get("gpu")), ("sampled", config.get("sampled-drafts")))}
    assert all("\n" not in line and line.startswith("seed = 42") for line in said.values())
    assert "same reply on every run, with or without speculation" in said["local"]
    assert "can give another reply" in said["gpu"]  # a server termchat does not run
    assert "only when the drafts are the same" in said["sampled"]
    assert ChatSession(SimpleNamespace(), builtin_profiles()["local"]).set_knob("top_k 40") == "top_k = 40 for the rest of this session (every profile)"


def test_text_prompts_get_the_loop_guard_and_code_prompts_none(tmp_path):
    from termchat import cli
    from termchat.chat.conversation import Conversation
    from termchat.profiles import builtin_profiles

    from .standin import StandIn

    local = builtin_profiles()["local"]
    assert local.guard("text") == {"frequency_penalty": 0.5} and local.guard("code") == {}
    assert local.sampling(guard=local.guard("text"))["frequency_penalty"] == 0.5 and local.sampling(guard=local.guard("code"))["frequency_penalty"] is None
    assert local.sampling({"frequency_penalty": 0.1}, local.guard("text"))["frequency_penalty"] == 0.1  # `/set` wins
    poem = Conversation().choose_temperature("Write a short poem about the sea at night.", local)
    code = Conversation().choose_temperature("Write a Python function that reverses a list.", local)
    assert poem.kind == "text" and poem.label().startswith("T=0.7, freq 0.5") and code.kind == "code" and "freq" not in code.label()
    with StandIn("ok") as standin:
        config = tmp_path / "c.toml"
        config.write_text(f'[profiles.standin]\nendpoint = "{standin.url}"\ntext_frequency_penalty = 0.5\n')
        for prompt in ("Write a short poem about the sea at night.", "Write a Python function that reverses a list."):
            assert cli.main(["ask", "--config", str(config), "--profile", "standin", prompt]) == 0
    poem_body, code_body = standin.requests
    assert poem_body["frequency_penalty"] == 0.5 and "frequency_penalty" not in code_body


def test_the_loop_watch_stops_a_repeating_reply_and_not_a_normal_one():
    from termchat.chat.loops import MIN_WORDS, LoopWatch, loops

    watch = LoopWatch()
    fed = 0
    while not watch.feed("Aeon, aeon, aeon of moon, "):
        fed += 1
    assert MIN_WORDS <= len(watch.text.split()) < MIN_WORDS + 5  # stopped as soon as it may judge
    prose = ("The sea at night is quiet. Far out, a lighthouse turns its slow beam across the water, "
             "and the boats come home one by one. On the shore a child counts the stars, loses count, "
             "and starts again; her father mends a net by lamplight and hums an old song about the tide. ") * 1
    watch = LoopWatch()
    assert not any(watch.feed(word + " ") for word in prose.split()) and not loops(prose)
    assert loops("a b c d e f " * 4) and not loops("one two three")


async def test_a_looping_reply_is_stopped_stored_as_cut_and_ctrl_r_asks_with_a_stronger_guard(tmp_path):
    from termchat.chat.store import Store
    from termchat.profiles import parse_config
    from termchat.ui.app import TermchatApp
    from termchat.ui.widgets.message import MessageView

    from .conftest import wait_for
    from .test_tui_coding import command
    from .standin import StandIn

    with StandIn("loop") as standin:
        config, _ = parse_config(f'[profiles.standin]\nendpoint = "{standin.url}"\ntext_frequency_penalty = 0.5\n', "standin.toml")
        app = TermchatApp(config=config, profile="standin", resume=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.5)
            await command(pilot, "Write a short poem about the sea at night.")
            replies = lambda: [v for v in app.query(MessageView) if v.role == "assistant"]  # noqa: E731
            await wait_for(pilot, lambda: replies() and replies()[-1].cut and not app.query_one("StatusBar").info.live, timeout=20, what="the stop")
            view = replies()[-1]
            assert "repeating itself" in str(view.query_one(".footer").render())
            assert view.text.count("aeon of moon") < 30  # stopped long before the 200 the server would send
            store = Store()
            assert store.messages(store.latest().id)[-1].status == "cut"
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: len(standin.requests) == 2, timeout=20, what="the regeneration")
            await wait_for(pilot, lambda: replies() and replies()[-1].cut, timeout=20, what="the second stop")
    first, second = standin.requests
    assert first["frequency_penalty"] == 0.5 and "repetition_penalty" not in first
    assert second["repetition_penalty"] == 1.2 and second["frequency_penalty"] == 0.5


def test_the_stronger_guard_goes_to_the_next_prompt_of_the_looping_conversation_only(tmp_path, monkeypatch):
    # found by hand: after a loop, Ctrl+N and a new prompt still got repetition_penalty 1.2
    from termchat.chat.loops import STRONGER
    from termchat.chat.store import Store

    monkeypatch.setenv("TERMCHAT_HOME", str(tmp_path))
    config, _ = parse_config("", "c.toml")
    session = ChatSession(config, builtin_profiles()["local"], Store())
    prompt = "Write a Python function that reverses a string."
    session.after_loop()
    assert set(STRONGER) <= set(session.prepare(prompt)[1].guard)  # the regeneration gets it
    assert not set(STRONGER) & set(session.prepare(prompt)[1].guard)  # once
    session.after_loop()
    session.new_conversation()
    assert not set(STRONGER) & set(session.prepare(prompt)[1].guard)
    session.begin_reply(prompt, session.prepare(prompt)[1])
    stored = session.conversation_id
    session.after_loop()
    session.load(stored)
    assert not set(STRONGER) & set(session.prepare(prompt)[1].guard)
