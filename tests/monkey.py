"""A seeded keyboard monkey: the real TUI, headless, pressed at random.

    python -m tests.monkey --seeds 1000 [--actions 40] [--first 0] [--jobs 2]

Each sequence starts the real app (Textual's `run_test`) on a fresh store and
folder, then does random actions from the README's key table and every slash
command, with random pauses so that they land before, during and after a
reply and while the engine starts. The engine is `SlowEndpoint`, a scripted
stand-in (NOT vLLM: the real engine cannot be cut at will, nor made to start
in a chosen time): an OpenAI-compatible server on loopback that streams short
replies a few milliseconds a step and records every request.

After each sequence it checks what the reply lifecycle (chat/reply.py) promises:
no exception, every action finished, nothing still streaming, the status bar
not left on "live", no stored message left "streaming", every stored reply
preceded by its prompt, the live conversation alternating and equal to the
stored branch and to the screen, every request the endpoint received well
ordered, no child process left. A failing seed prints its actions, so it can
be replayed (`--first SEED --seeds 1 -v`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from textual.widgets import Input, TextArea

from .standin import MODEL, SlowEndpoint



# ---- the actions --------------------------------------------------------------------------

KEYS = [
    "ctrl+n", "f3", "ctrl+l", "f2", "escape", "escape", "ctrl+r", "f4", "f8", "ctrl+g", "ctrl+s",
    "f9", "ctrl+o", "f5", "f1", "ctrl+t", "ctrl+p", "enter", "enter", "y", "n", "down", "up",
    "ctrl+d", "alt+1", "alt+2", "tab",
]
COMMANDS = [
    "/profile", "/profile b", "/profile a", "/temp 0.3", "/system be brief", "/file notes.txt",
    "/file .", "/file /dev/null", "/apply out.py", "/undo", "/cd .", "/run echo hi", "/run sleep 0.3",
    "/add", "/test", "/fix", "/fix 2", "/edit", "/edit 1", "/clear", "/restart", "/help", "/nope",
]
PROMPTS = ["hello there", "write a python function add(a, b)", "tell me more", "why?", "fix it"]
PAUSES = [0, 0, 0, 0.01, 0.02, 0.05, 0.1, 0.2]
QUIT = ["ctrl+q", "/quit"]


def plan(seed: int, actions: int) -> list[tuple[str, str, float]]:
    """The sequence of a seed: (kind, what, pause after), kind one of key/type."""
    rng = random.Random(seed)
    out = []
    for _ in range(actions):
        roll = rng.random()
        if roll < 0.35:
            what = ("type", rng.choice(PROMPTS))
        elif roll < 0.65:
            what = ("type", rng.choice(COMMANDS))
        else:
            what = ("key", rng.choice(KEYS))
        out.append((*what, rng.choice(PAUSES)))
    if rng.random() < 0.2:  # some sequences end by quitting mid-whatever
        out[-1] = ("type", "/quit", 0) if rng.random() < 0.5 else ("key", "ctrl+q", 0)
    return out


class Hang(Exception):
    pass


@dataclass
class Result:
    seed: int
    problem: str = ""  # "" when every invariant held
    detail: str = ""
    actions: list = field(default_factory=list)
    seconds: float = 0.0
    landed: dict = field(default_factory=dict)  # how many actions landed mid-reply, while the engine started


ACTION_TIMEOUT_S = 20.0  # an action not finished by then is a hang
SETTLE_TIMEOUT_S = 20.0  # for what runs to end after the last action


def config_for(url: str):
    from termchat.profiles import Config, parse_config

    profile = 'endpoint = "{url}"\nmodel = "{model}"\nmax_tokens = 64\nfirst_token_timeout = 10\n'
    text = "".join(f'[profiles.{name}]\ndescription = "stand-in {name}"\n' + profile.format(url=url, model=MODEL) for name in ("a", "b"))
    config, problems = parse_config(text, "monkey.toml")
    assert not problems, problems
    # only the stand-in's profiles: a built-in one would start a real engine
    return Config({name: config.profiles[name] for name in ("a", "b")}, default_profile="a")


@contextlib.contextmanager
def slow_engine_start(delay: Callable[[], float]):
    """Engines take `delay()` s to be ready, as a real one takes 30 s: prompts land while it starts."""
    from termchat.engine import controller

    real = controller.open_engine_async

    async def slow(profile, *args, **kwargs):
        await asyncio.sleep(delay())
        return await real(profile, *args, **kwargs)

    controller.open_engine_async = slow
    try:
        yield
    finally:
        controller.open_engine_async = real


async def run_sequence(seed: int, actions: int = 40, verbose: bool = False) -> Result:
    from termchat.chat.store import Store
    from termchat.ui.app import TermchatApp

    steps = plan(seed, actions)
    result = Result(seed, actions=steps)
    started = time.monotonic()
    before = children()
    with tempfile.TemporaryDirectory(prefix="termchat-monkey-") as folder, SlowEndpoint(seed) as endpoint:
        home = Path(folder)
        (home / "work").mkdir()
        (home / "work" / "notes.txt").write_text("some notes\n")
        old_home = os.environ.get("TERMCHAT_HOME")
        os.environ["TERMCHAT_HOME"] = str(home / "home")
        old_cwd = os.getcwd()
        os.chdir(home / "work")
        store = Store(home / "history.db")
        app = TermchatApp(config=config_for(endpoint.url), profile="a", resume=False, store=store)
        done = 0
        try:
            starts = random.Random(seed)
            with slow_engine_start(lambda: starts.choice([0, 0.05, 0.2, 0.5])):
                async with app.run_test(size=(80, 24)) as pilot:
                    for kind, what, pause in steps:
                        if not app.is_running:
                            break
                        at = time.monotonic()
                        state = "mid-reply" if any(w.group == "reply" and not w.is_finished for w in app.workers) else "starting" if app.chat_screen.pending else ""
                        result.landed[state] = result.landed.get(state, 0) + 1
                        await asyncio.wait_for(act(pilot, kind, what), ACTION_TIMEOUT_S)
                        if verbose:
                            print(f"  {done:2d} {kind} {what!r} {state} took {time.monotonic() - at:.2f} s, then pause {pause}", flush=True)
                        done += 1
                        if pause:
                            await pilot.pause(pause)
                    if app.is_running:
                        try:
                            await asyncio.wait_for(quiet(pilot), SETTLE_TIMEOUT_S)
                        except TimeoutError:
                            raise Hang(f"still running {SETTLE_TIMEOUT_S:.0f} s after the last action: {', '.join(running(app))}; screen {type(app.screen).__name__}; engine {app.engines.state}; status {app.chat_screen.query_one('#status').info.engine}; panel {app.chat_screen.panel.display} {app.chat_screen.query_one('#engine-status').render()}") from None
                        # not once the app quits: its screen is being taken down (the store is checked below)
                        problem = check_screen(app) if app.return_code is None else ""
                        if problem:
                            result.problem, result.detail = "invariant", problem
        except Hang as exc:
            result.problem, result.detail = "hang", str(exc)
        except TimeoutError:
            result.problem = "hang"
            result.detail = f"action {done} ({steps[done] if done < len(steps) else 'settling'}) did not finish in {ACTION_TIMEOUT_S:.0f} s"
        except Exception as exc:  # noqa: BLE001: a crash of the app, or of the monkey
            result.problem, result.detail = "crash", "".join(traceback.format_exception(exc))[-4000:]
        finally:
            os.chdir(old_cwd)
            if old_home is None:
                os.environ.pop("TERMCHAT_HOME", None)
            else:
                os.environ["TERMCHAT_HOME"] = old_home
        if not result.problem:
            problem = check_store(store) or check_requests(endpoint.requests) or check_processes(before)
            if problem:
                result.problem, result.detail = "invariant", problem
        store.close()
    result.seconds = time.monotonic() - started
    return result


async def act(pilot, kind: str, what: str) -> None:
    """One action, as a terminal delivers it: the key events go in at once.

    Not `pilot.press`: it also waits for the process to be idle, i.e. for the
    streaming reply to end, so no key would ever land mid-reply. This waits
    only until the screen has taken the events (a hang if it never does)."""
    app = pilot.app
    if kind == "type":
        # typed text is key events too, in the same queue as the Enter after it: inserted
        # directly, a second text could land before the first one's Enter was taken
        # ("first" + "second" sent as "firstsecond")
        if isinstance(app.focused, (TextArea, Input)):
            for char in what:
                app._driver.send_message(key_event(app, char))
        what = "enter"
    app._driver.send_message(key_event(app, what))
    if not await pilot._wait_for_screen(ACTION_TIMEOUT_S):
        raise Hang(f"the app stopped taking events after {what!r}")


def key_event(app, key: str):
    """The Key event a terminal gives for `key` (as Textual's own `_press_keys` builds it)."""
    import unicodedata

    from textual import events
    from textual.keys import REPLACED_KEYS, _get_unicode_name_from_key

    try:
        char = unicodedata.lookup(_get_unicode_name_from_key(REPLACED_KEYS.get(key, key)))
    except KeyError:
        char = key if len(key) == 1 else None
    event = events.Key(key, char)
    event.set_sender(app)
    return event


async def quiet(pilot) -> None:
    """Until nothing runs: close what is open over the chat (as a user would,
    with Escape), end the fix loop, wait for the reply, the command and the engine."""
    app = pilot.app
    screen = app.chat_screen
    # quiet for a few polls in a row: an action, the reply it starts and the
    # screen hearing of its end are each a message apart
    calm = 0
    while calm < 4 and app.return_code is None:  # not once the app is quitting (Ctrl+Q)
        if app.screen is not screen:  # a screen opened by a late worker (a diff to confirm...)
            await pilot.press("escape")
        screen.stop_fixing()
        calm = 0 if running(app) or app.screen is not screen else calm + 1
        await pilot.pause(0.05)


def running(app) -> list[str]:
    """What still runs: the reply, a waiting prompt, a command, any worker."""
    screen = app.chat_screen
    busy = [w.name or w.group for w in app.workers if not w.is_finished]
    if screen.query_one("#status").info.live:
        busy.append("the status bar's live figures")
    if screen.pending is not None:
        busy.append("a prompt waiting for the engine")
    if screen.running is not None:
        busy.append(f"the command {screen.running.command!r}")
    return busy


def check_screen(app) -> str:
    """The live conversation alternates and is what the screen and the store show."""
    from termchat.engine.endpoint import EngineState
    from termchat.ui.widgets.message import MessageView
    from termchat.ui.widgets.status import StatusBar

    screen = app.chat_screen
    session = screen.session
    info = screen.query_one(StatusBar).info
    if info.live or info.engine in (EngineState.STREAMING, EngineState.WAITING):
        return f"status bar left on {info.engine} (live={info.live}) with nothing running"
    live = [(m["role"], m["content"]) for m in session.conversation.messages]
    problem = alternation(live, "the live conversation")
    if problem:
        return problem
    shown = [(v.role, v.text) for v in screen.query(MessageView)]
    if shown != live:
        return f"the screen shows {summary(shown)} but the model would see {summary(live)}"
    if session.store is not None and session.conversation_id:
        stored = [(m.role, m.content) for m in session.store.messages(session.conversation_id)]
        if stored != live:
            return f"conversation {session.conversation_id} is stored as {summary(stored)} but live as {summary(live)}"
    return ""


def check_store(store) -> str:
    for record in store.conversations(limit=10_000):
        messages = store.messages(record.id)
        problem = alternation([(m.role, m.content) for m in messages], f"stored conversation {record.id}")
        if problem:
            return problem
        left = [m.id for m in messages if m.status == "streaming"]
        if left:
            return f"messages {left} of conversation {record.id} are still stored as streaming"
    return ""


def check_requests(requests: list[list[dict]]) -> str:
    for number, messages in enumerate(requests, start=1):
        turns = [(m["role"], m["content"]) for m in messages if m["role"] != "system"]
        problem = alternation(turns, f"request {number}")
        if problem:
            return problem
        if not turns or turns[-1][0] != "user":
            return f"request {number} does not end with the user's prompt: {summary(turns)}"
    return ""


def alternation(turns: list[tuple[str, str]], what: str) -> str:
    for index, (role, _) in enumerate(turns):
        if role != ("user" if index % 2 == 0 else "assistant"):
            return f"{what} does not alternate user/assistant: {summary(turns)}"
    return ""


def summary(turns) -> str:
    return " ".join(f"{role[0]}:{content[:12]!r}" for role, content in turns) or "(empty)"


def children() -> set[int]:
    """Live processes whose parent is this one (commands run by /run and /test)."""
    from termchat.engine import proc

    return proc.children(os.getpid())


def check_processes(before: set[int]) -> str:
    deadline = time.monotonic() + 3
    while (left := children() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    return f"processes left running: {sorted(left)}" if left else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.monkey", description="Random keys and commands against the TUI; checks the reply lifecycle's invariants.")
    parser.add_argument("--seeds", type=int, default=20, help="how many sequences (default 20)")
    parser.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--actions", type=int, default=40, help="actions per sequence (default 40)")
    parser.add_argument("--jobs", type=int, default=1, help="sequences run at once, in separate processes")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each action")
    args = parser.parse_args(argv)
    seeds = list(range(args.first, args.first + args.seeds))
    started = time.monotonic()
    if args.jobs > 1:
        import subprocess

        share = [seeds[i :: args.jobs] for i in range(args.jobs)]
        procs = [subprocess.Popen([sys.executable, "-m", "tests.monkey", "--seed-list", ",".join(map(str, part)), "--actions", str(args.actions)], stdout=subprocess.PIPE, text=True) for part in share if part]
        lines = [line for proc in procs for line in proc.communicate()[0].splitlines()]
        failed = [line for line in lines if line.startswith("FAIL")]
        print("\n".join(lines))
    else:
        failed = []
        for seed in seeds:
            result = asyncio.run(run_sequence(seed, args.actions, args.verbose))
            line = report(result)
            print(line, flush=True)
            if result.problem:
                failed.append(line)
    counts = {kind: sum(f.split()[3].rstrip(":") == kind for f in failed) for kind in ("crash", "hang", "invariant")}
    print(f"{len(seeds)} sequences of {args.actions} actions in {time.monotonic() - started:.0f} s: {counts['crash']} crashes, {counts['hang']} hangs, {counts['invariant']} invariant breaks")
    return 1 if failed else 0


def report(result: Result) -> str:
    if not result.problem:
        return f"ok   seed {result.seed} ({result.seconds:.1f} s; {result.landed.get('mid-reply', 0)} actions mid-reply, {result.landed.get('starting', 0)} with a prompt waiting for the engine)"
    actions = ", ".join(f"{what}" for _, what, _ in result.actions)
    return f"FAIL seed {result.seed} {result.problem}: {result.detail}\n     actions: {actions}"


def _seed_list_main(argv: list[str]) -> int:
    """A worker process of --jobs: the seeds it is given, one line each."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed-list", required=True)
    parser.add_argument("--actions", type=int, default=40)
    args = parser.parse_args(argv)
    for seed in map(int, args.seed_list.split(",")):
        print(report(asyncio.run(run_sequence(seed, args.actions))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_seed_list_main(sys.argv[1:]) if "--seed-list" in sys.argv else main())
