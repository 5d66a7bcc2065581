"""Decode speed in the TUI beside `termchat ask`, on one engine, same run.

    python -m termchat.bench.tui [--profile local-plain] [--category code|edit] [--prompts 4] [--rounds 2] [--nice 0]

The TUI draws every reply while the engine decodes on the same cores; this
bench measures what that costs a user. It starts the profile's engine once
(a throw-away TERMCHAT_HOME, the converted models shared), opens the real TUI
in tmux (120x40) on that engine, and for each prompt of the built-in `code`
or `edit` set (both front-ends lower the temperature to greedy for them; edit
replies are the longer, 100-400 tokens, where a long fence is drawn) asks it once with `termchat ask --json` and once in the TUI (Ctrl+N,
the prompt, Enter), alternating so that a machine that drifts affects both.
The TUI's figure is the reply footer's tok/s (the engine's own clock, as ask
reports), read off the screen; its CPU comes from /proc over the reply.

`--nice 0,10` opens one TUI per value (run under `nice -n N`) and asks each
in turn: whether a lower priority for the front-end gives the engine's
threads their cores back. Prints the CPU line, a row per prompt and the
medians; asserts nothing. Needs tmux.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from termchat import paths
from termchat.bench.command import machine_line
from termchat.bench.prompt_sets import builtin
from termchat.engine import proc

FOOTER = re.compile(r"(\d+) tokens · ([\d.]+) tok/s")
READY = re.compile(r"│ ready │")
REPLY_S = 180.0  # the longest a reply may take before the bench gives up on it


class Tui:
    """The real TUI in a tmux session of its own."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], nice: int):
        self.name = name
        wrapped = ["nice", "-n", str(nice), *cmd] if nice else cmd
        extra = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "120", "-y", "40", *extra, "exec " + shlex.join(wrapped)], check=True)
        self.pid = int(subprocess.run(["tmux", "display", "-p", "-t", name, "#{pane_pid}"], capture_output=True, text=True, check=True).stdout)
        self.wait(lambda s: READY.search(s), "the TUI to be ready", 300)

    def screen(self) -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True).stdout

    def keys(self, *keys: str, literal: bool = False) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *(["-l"] if literal else []), *keys], check=True)

    def wait(self, done, what: str, seconds: float) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            screen = self.screen()
            if done(screen):
                return screen
            time.sleep(0.25)
        raise SystemExit(f"the TUI in tmux session {self.name} did not show {what} in {seconds:.0f} s; its screen:\n{self.screen()}")

    def ask(self, prompt: str) -> tuple[float, int, float]:
        """(tok/s off the reply's footer, tokens, cores the TUI used over the reply)."""
        self.keys("C-n")
        self.wait(lambda s: not FOOTER.search(s) and READY.search(s), "a new conversation", 30)
        before, began = proc.cpu_ticks(self.pid), time.monotonic()
        self.keys(prompt, literal=True)
        self.keys("Enter")
        screen = self.wait(lambda s: FOOTER.search(s) and READY.search(s), "the reply's end", REPLY_S)
        cores = (proc.cpu_ticks(self.pid) - before) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - began)
        tokens, rate = FOOTER.findall(screen)[-1]
        return float(rate), int(tokens), cores

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m termchat.bench.tui", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="local-plain", help="a built-in profile")
    parser.add_argument("--category", default="code", choices=("code", "edit"), help="the built-in prompts (both lower the temperature to greedy)")
    parser.add_argument("--prompts", type=int, default=4, help="how many of the category's prompts (1-20)")
    parser.add_argument("--rounds", type=int, default=2, help="times each prompt is asked (1-10)")
    parser.add_argument("--nice", default="0", help="the TUI's niceness, comma-separated values 0-19: one TUI each")
    args = parser.parse_args(argv)
    if not 1 <= args.prompts <= 20 or not 1 <= args.rounds <= 10:
        parser.error("--prompts takes 1 to 20 and --rounds 1 to 10")
    try:
        nices = [int(n) for n in args.nice.split(",")]
    except ValueError:
        parser.error(f"--nice takes whole numbers separated by commas, not {args.nice!r}")
    if not all(0 <= n <= 19 for n in nices) or len(set(nices)) != len(nices):
        parser.error("--nice takes distinct values from 0 to 19")
    if not shutil.which("tmux"):
        print("tmux is not installed here: it runs the TUI (apt install tmux)", file=sys.stderr)
        return 2
    termchat = [str(Path(sys.executable).with_name("termchat"))]
    prompts = [p.text.strip() for p in builtin([args.category])[: args.prompts]]  # as the TUI sends it: a final newline changes the reply
    print(machine_line())
    print(f"profile {args.profile}; {len(prompts)} {args.category} prompts x {args.rounds} rounds; TUI 120x40 in tmux; tok/s on the engine's clock")
    with tempfile.TemporaryDirectory(prefix="termchat-bench-tui-") as home:
        env = {"TERMCHAT_HOME": home, "TERMCHAT_MODELS": str(paths.models_dir())}
        run_env = {**os.environ, **env}

        def ask(prompt: str, max_tokens: int | None = None) -> tuple[float, int]:
            more = ["--max-tokens", str(max_tokens)] if max_tokens else []
            done = subprocess.run([*termchat, "ask", "--profile", args.profile, "--json", "--no-save", *more, prompt], capture_output=True, text=True, env=run_env)
            if done.returncode != 0:
                raise SystemExit(f"termchat ask failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
            reply = json.loads(done.stdout)
            return reply["decode_tokens_per_s"] or 0.0, reply["output_tokens"] or 0

        tuis: dict[int, Tui] = {}
        try:
            ask("Say hi.", 8)  # starts the engine; it stays warm for the TUIs
            for n in nices:
                tuis[n] = Tui(f"termchat-bench-tui-{os.getpid()}-{n}", [*termchat, "--profile", args.profile], env, n)
            rows: list[tuple[int, str, float, int, float | None]] = []  # (prompt, front-end, tok/s, tokens, TUI cores)
            for _ in range(args.rounds):
                for i, prompt in enumerate(prompts):
                    rate, tokens = ask(prompt)
                    rows.append((i, "ask", rate, tokens, None))
                    for n, tui in tuis.items():
                        rows.append((i, f"TUI nice {n}", *tui.ask(prompt)))
        finally:
            for tui in tuis.values():
                tui.close()
            subprocess.run([*termchat, "stop", "--all"], capture_output=True, env=run_env)
    fronts = ["ask"] + [f"TUI nice {n}" for n in nices]
    print("| prompt | " + " | ".join(f"{f} tok/s (tokens)" for f in fronts) + " |")
    print("|---" * (len(fronts) + 1) + "|")
    for i in range(len(prompts)):
        cells = [", ".join(f"{r[2]:.1f} ({r[3]})" for r in rows if r[0] == i and r[1] == f) for f in fronts]
        print(f"| {args.category} {i + 1} | " + " | ".join(cells) + " |")
    ask_median = statistics.median(r[2] for r in rows if r[1] == "ask")
    print(f"median: ask {ask_median:.1f} tok/s")
    for f in fronts[1:]:
        mine = [r for r in rows if r[1] == f]
        ratios = [r[2] / a[2] for r, a in zip(mine, (a for a in rows if a[1] == "ask")) if a[2]]
        print(f"median: {f} {statistics.median(r[2] for r in mine):.1f} tok/s, {statistics.median(ratios):.2f}x ask (per-prompt ratios {min(ratios):.2f}-{max(ratios):.2f}), "
              f"the TUI used {statistics.median(r[4] for r in mine):.2f} of a core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
