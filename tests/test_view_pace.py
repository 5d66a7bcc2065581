"""The streamed reply's view keeps to its CPU share (ui/widgets/message.py,
PacedStream): a long code fence is highlighted and drawn whole at every
update, and at one update per engine step the view took 0.8 of a core from
the engine (bench.ui_stream). A stand-in widget whose update costs a fixed
CPU time stands for that fence (NOT Textual's Markdown: the cost must be
known to check the share)."""

import asyncio
import time

from termchat.ui.widgets import message
from termchat.ui.widgets.message import PacedStream

COST_S = 0.02  # CPU per update, as a fence of a few hundred lines costs


class CostlyWidget:
    def __init__(self, cost_s: float):
        self.cost_s = cost_s
        self.text, self.updates, self.cpu = "", 0, 0.0

    async def append(self, fragment: str) -> None:
        began = time.process_time()
        while time.process_time() - began < self.cost_s:
            pass
        self.cpu += time.process_time() - began
        self.text += fragment
        self.updates += 1

    def call_after_refresh(self, callback) -> bool:  # nothing to draw: drawn at once
        callback()
        return True


async def stream(pieces: list[str], gap_s: float, cost_s: float) -> tuple[CostlyWidget, float]:
    widget = CostlyWidget(cost_s)
    paced = PacedStream(widget)
    paced.start()
    began = time.monotonic()
    for piece in pieces:
        await paced.write(piece)
        await asyncio.sleep(gap_s)
    wall = time.monotonic() - began
    await paced.stop()
    return widget, wall


def test_updates_keep_to_the_share_and_every_fragment_arrives_in_order():
    pieces = [f"line {i}\n" for i in range(300)]
    widget, wall = asyncio.run(stream(pieces, 0.004, COST_S))  # 250 steps a second
    assert widget.text == "".join(pieces)
    # the last update (stop's) is not paced; before it, updates cost at most the share of the time
    assert widget.cpu - COST_S <= message.VIEW_SHARE * wall + COST_S
    assert widget.updates >= 2  # and it did update while the steps came


def test_a_cheap_update_waits_for_the_shortest_interval_only():
    pieces = [f"w{i} " for i in range(100)]
    widget, wall = asyncio.run(stream(pieces, 0.003, 0.0))
    assert widget.text == "".join(pieces)
    low, _high = message.UPDATE_EVERY_S
    assert widget.updates <= wall / low + 2
