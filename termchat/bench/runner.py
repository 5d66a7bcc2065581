"""Run prompt sets with and without speculation, one engine at a time.

The same engine settings run twice: with the profile's speculation (once per
swept `num_speculative_tokens`), then without (one baseline engine serves every
sweep value). On a GPU both would not fit at once, and on a CPU they would
compete for the cores. Each engine is warmed up first: the first request
after start-up includes compilation and allocation.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, replace

from termchat.bench.prompt_sets import BenchPrompt
from termchat.bench.report import Sample, count_improbable
from termchat.engine.verify import TOP_LOGPROBS, stream_row
from termchat.detect.classify import temperature_for
from termchat.engine.process import ManagedEngine
from termchat.engine.client import Sampling, complete_sync
from termchat.errors import UserError
from termchat.profiles import Profile
from termchat.progress import ProgressLine

ENGINE_START_S = 40.0  # for the time estimate, until one start has been measured


@dataclass(frozen=True)
class Condition:
    k: int | None  # num_speculative_tokens for the speculative run
    temperature: float | None  # None: automatic (classifier + profile temperatures)

    def label(self) -> str:
        parts = []
        if self.k is not None:
            parts.append(f"k={self.k}")
        parts.append("T=auto" if self.temperature is None else f"T={self.temperature:g}")
        return " ".join(parts)


class Progress:
    """A progress bar with a time estimate, on stderr."""

    def __init__(self, total_requests: int, engines: int):
        self.total, self.done = total_requests, 0
        self.engines_left = engines
        self.started = time.monotonic()
        self.request_time = 0.0
        self.engine_time: list[float] = []
        self.line = ProgressLine(every=15.0)

    def engine_started(self, seconds: float) -> None:
        self.engine_time.append(seconds)
        self.engines_left -= 1

    def request(self, seconds: float, label: str) -> None:
        self.done += 1
        self.request_time += seconds
        per_request = self.request_time / self.done
        per_engine = sum(self.engine_time) / len(self.engine_time) if self.engine_time else ENGINE_START_S
        left = (self.total - self.done) * per_request + self.engines_left * per_engine
        width = 30
        filled = int(width * self.done / self.total)
        line = f"[{'█' * filled}{'·' * (width - filled)}] {self.done}/{self.total} {label[:40]:<40} ~{left / 60:.0f} min left"
        self.line.show(line, final=self.done == self.total)

    def say(self, text: str) -> None:
        self.line.say(text)


def _seed(prompt: BenchPrompt, run: int) -> int:
    return zlib.crc32(f"{prompt.id}:{run}".encode()) & 0x7FFFFFFF


def request(profile: Profile, prompt: BenchPrompt, max_tokens: int, temperature: float | None = None, run: int = 0) -> tuple[list[dict], Sampling]:
    """What the bench sends for a prompt: the profile's system prompt, its temperature
    for the prompt's kind (or `temperature`), its sampling with the text guard, a seed
    per prompt and run, and log-probabilities at T > 0 (the report checks from them
    that speculation sampled what the model samples without it)."""
    value, detected = temperature_for(prompt.text, profile.temperature, profile.code_temperature)
    if temperature is not None:
        value = temperature
    system = [{"role": "system", "content": profile.system_prompt}] if profile.system_prompt else []
    sampling = Sampling(temperature=value, **(profile.sampling(guard=profile.guard(detected.kind)) | {"max_tokens": max_tokens, "seed": _seed(prompt, run)}),
                        logprobs=value > 0, top_logprobs=TOP_LOGPROBS if value > 0 else 0)
    return system + [{"role": "user", "content": prompt.text}], sampling


def _requests(engine, profile: Profile, prompts: list[BenchPrompt], runs: int, max_tokens: int, temperature: float | None, speculative: bool, progress: Progress, label: str) -> list[Sample]:
    samples = []
    for prompt in prompts:
        for run in range(runs):
            started = time.monotonic()
            stream = complete_sync(engine, *request(profile, prompt, max_tokens, temperature, run))
            stats = stream.stats
            progress.request(time.monotonic() - started, f"{label} {prompt.id}")
            if not stats.decode_tokens_per_s:
                continue  # a one-token reply has no decode phase to measure
            samples.append(
                Sample(
                    prompt_id=prompt.id,
                    category=prompt.category,
                    speculative=speculative,
                    stats=stats,
                    run=run,
                    mean_logprob=sum(stream.token_logprobs) / len(stream.token_logprobs) if stream.token_logprobs else None,
                    improbable=count_improbable(stream.token_logprobs) if stream.token_logprobs else None,
                    rank_row=stream_row(stream) if stream.token_top else None,
                )
            )
    return samples


def warm_up(engine) -> None:
    """Two short requests before anything is timed: allocation (and, eager,
    kernel selection) happen on the first requests."""
    for _ in range(2):
        complete_sync(engine, [{"role": "user", "content": "Write one sentence about the sea."}], Sampling(temperature=0.0, max_tokens=32))


def _start(profile: Profile, progress: Progress):
    started = time.monotonic()
    progress.say(f"starting engine '{profile.name}'" + (f" ({profile.speculative.label()})" if profile.speculative else " (no speculation)"))
    engine = ManagedEngine.launch(profile)
    try:
        engine.wait_ready()
        warm_up(engine)
    except BaseException:
        engine.stop()
        raise
    progress.engine_started(time.monotonic() - started)
    return engine


def baseline_key(profile: Profile) -> str:
    """Profiles that differ only in speculation share one baseline engine."""
    plain = replace(profile.without_speculation(), name="", description="", source="", theme=None)
    return repr(plain)


def run(profiles: list[Profile], prompts: list[BenchPrompt], runs: int, max_tokens: int, temperatures: list[float | None], ks: list[int | None]) -> dict[str, dict[Condition, list[Sample]]]:
    """Samples per profile and condition: each holds its speculative and baseline samples.

    The no-speculation baseline runs once per model configuration, however
    many profiles share it; a profile without speculation is measured as
    that baseline (its speed-up is 1.0 by definition)."""
    for profile in profiles:
        if profile.is_remote:
            raise UserError(f"profile '{profile.name}' is a remote endpoint: the bench must start the engine itself to compare with and without speculation. Bench a local profile, or run termchat on the server")
    speculative = [p for p in profiles if p.speculative]
    if not speculative:
        raise UserError(f"none of {', '.join(p.name for p in profiles)} speculates; add [profiles.NAME.speculative] to one of them")
    groups: dict[str, list[Profile]] = {}
    for profile in profiles:
        groups.setdefault(baseline_key(profile), []).append(profile)
    per_engine = len(prompts) * runs * len(temperatures)
    engines = len(speculative) * len(ks) + len(groups)
    progress = Progress(per_engine * engines, engines)
    results: dict[str, dict[Condition, list[Sample]]] = {p.name: {} for p in profiles}
    for members in groups.values():
        for profile in [p for p in members if p.speculative]:
            for k in ks:
                spec_profile = profile if k is None else replace(profile, speculative=profile.speculative.with_changes(num_speculative_tokens=k))
                engine = _start(spec_profile, progress)
                try:
                    for temperature in temperatures:
                        condition = Condition(k, temperature)
                        results[profile.name][condition] = _requests(engine, profile, prompts, runs, max_tokens, temperature, True, progress, f"{profile.name} {condition.label()}")
                finally:
                    engine.stop()
        first = members[0]
        engine = _start(first.without_speculation(), progress)
        try:
            for temperature in temperatures:
                baseline = _requests(engine, first, prompts, runs, max_tokens, temperature, False, progress, f"baseline T={'auto' if temperature is None else temperature}")
                for profile in members:
                    for k in ks if profile.speculative else [None]:
                        results[profile.name].setdefault(Condition(k, temperature), []).extend(baseline)
        finally:
            engine.stop()
    progress.say(f"done in {(time.monotonic() - progress.started) / 60:.1f} min")
    return results
