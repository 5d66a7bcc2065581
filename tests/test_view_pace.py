"""The streamed reply's view keeps to its CPU share (ui/widgets/message.py,
Pacer): a long code fence is highlighted and drawn whole at every update,
and at one update per engine step the view took 0.8 of a core from the
engine (bench.ui_stream). A stand-in whose update costs a fixed CPU time
stands for that fence (NOT Textual's Markdown: the cost must be known to
check the share); the real view is checked for losing nothing, also when it
is removed mid-reply."""

import asyncio
import time

from termchat.engine.stats import Step
from termchat.ui.widgets import message
from termchat.ui.widgets.message import MessageView, Pacer

COST_S = 0.02  # CPU per update, as a fence of a few hundred lines costs


class CostlyShow:
    def __init__(self, cost_s: float):
        self.cost_s = cost_s
        self.text, self.cpu = "", 0.0

    async def __call__(self, fragment: str) -> None:
        began = time.thread_time()
        while time.thread_time() - began < self.cost_s:
            pass
        self.cpu += time.thread_time() - began
        self.text += fragment


async def drawn_at_once() -> None:
    return None


async def stream(pieces: list[str], gap_s: float, cost_s: float) -> tuple[CostlyShow, Pacer, float]:
    shown = CostlyShow(cost_s)
    runs = []
    pacer = Pacer(shown, drawn_at_once, lambda run: runs.append(asyncio.create_task(run)))
    began = time.monotonic()
    for piece in pieces:
        pacer.write(piece)
        await asyncio.sleep(gap_s)
    wall = time.monotonic() - began
    await pacer.close()
    assert runs and all(run.done() for run in runs)
    return shown, pacer, wall


def test_updates_keep_to_the_share_and_every_fragment_arrives_in_order():
    pieces = [f"line {i}\n" for i in range(300)]
    shown, pacer, wall = asyncio.run(stream(pieces, 0.004, COST_S))  # 250 steps a second
    assert shown.text == "".join(pieces)
    # close's update is not paced; before it, updates cost at most the share of the time (one in hand)
    assert shown.cpu - COST_S <= message.VIEW_SHARE * wall + COST_S
    assert pacer.updates >= 3  # and it did update while the steps came
    # unpaced, one update per step would have cost 300 x 20 ms: the stand-in's share is what pacing saves
    assert pacer.updates < len(pieces) / 5


def test_a_cheap_update_waits_for_the_shortest_interval_only():
    pieces = [f"w{i} " for i in range(100)]
    shown, pacer, wall = asyncio.run(stream(pieces, 0.003, 0.0))
    assert shown.text == "".join(pieces)
    low, _high = message.UPDATE_EVERY_S
    assert wall / low / 2 <= pacer.updates <= wall / low + 2


def test_nothing_is_shown_after_close_and_a_pacer_that_never_ran_shows_all_at_close():
    async def go():
        shown = CostlyShow(0.0)
        runs = []
        pacer = Pacer(shown, drawn_at_once, runs.append)  # its run is never started
        pacer.write("a")
        pacer.write("b")
        await pacer.close()
        pacer.write("late")
        await pacer.close()
        for run in runs:
            run.close()
        return shown.text, len(runs)
    assert asyncio.run(go()) == ("ab", 1)


def test_an_idle_pacer_has_nothing_running_and_starts_again_on_the_next_fragment():
    async def go():
        shown = CostlyShow(0.0)
        runs = []
        pacer = Pacer(shown, drawn_at_once, lambda run: runs.append(asyncio.create_task(run)))
        pacer.write("a")
        await asyncio.sleep(2 * message.UPDATE_EVERY_S[0] + 0.05)
        idle = all(run.done() for run in runs)
        pacer.write("b")
        await asyncio.sleep(0)
        shown_before_close = shown.text
        await pacer.close()
        return idle, len(runs), shown_before_close, shown.text
    idle, runs, before, after = asyncio.run(go())
    assert idle and runs == 2 and before == "ab" and after == "ab"


async def test_the_view_shows_the_whole_reply_and_survives_removal_mid_reply():
    from termchat.ui.app import TermchatApp

    pieces = ["Here:\n\n```python\n", *(f"x_{i} = {i}\n" for i in range(200)), "```\n\ndone.\n"]
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = app.query_one("#chat")
        kept, removed = MessageView("assistant", "stand-in"), MessageView("assistant", "stand-in")
        await chat.mount_all([kept, removed])
        for number, piece in enumerate(pieces):
            await kept.append(Step(piece, (number,), time.monotonic()))
            await removed.append(Step(piece, (number,), time.monotonic()))
            if number == 100:
                await removed.remove()
            await asyncio.sleep(0.001)
        await asyncio.wait_for(removed.finish(None), 5)  # removed mid-reply: ends at once
        await asyncio.wait_for(kept.finish(None), 5)
        await pilot.pause()
        assert kept.body.source == "".join(pieces)
        assert removed.text == "".join(pieces)  # the reply is kept whole off the screen too
        assert not [w for w in app.workers if w.group == "view" and not w.is_finished]
