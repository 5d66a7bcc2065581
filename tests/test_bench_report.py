"""Bench arithmetic on fixed numbers, and the Spec-Bench reader."""

from __future__ import annotations

from dataclasses import replace

import pytest

from termchat.bench import prompt_sets
from termchat.engine.stats import ReplyStats
from termchat.bench.report import Sample, bar_chart, ideal_speedup, lossless_line, quantiles, summarize, table, verdict
from termchat.errors import UserError
from termchat.profiles import in_format


def sample(prompt_id, category, speculative, tokens_per_s, output_tokens, accepted=None, drafted=None, spec_steps=None, histogram=(), temperature=None, mean_logprob=None, run=0, steps=None, improbable=None) -> Sample:
    """A bench sample in the report's own shape: one ReplyStats and where it stands."""
    stats = ReplyStats(output_tokens=output_tokens, decode_tokens_per_s=tokens_per_s, accepted_tokens=accepted, draft_tokens=drafted, spec_steps=spec_steps, acceptance_histogram=list(histogram), temperature=temperature, steps=steps or 0)
    return Sample(prompt_id, category, speculative, stats, run=run, mean_logprob=mean_logprob, improbable=improbable)


def test_ideal_speedup_formula():
    # (1 - a^(k+1)) / ((1 - a)(k*c + 1))
    assert ideal_speedup(0.6, 5, 0.0) == pytest.approx((1 - 0.6**6) / 0.4)
    assert ideal_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))
    assert ideal_speedup(1.0, 5, 0.0) == 6  # every draft accepted: k + 1 tokens per step
    assert ideal_speedup(0.0, 5, 1.0) == pytest.approx(1 / 6)  # nothing accepted, draft as costly as target


def test_verdicts_follow_the_thresholds_and_check_the_measurement():
    assert verdict(0.35, 0.9).startswith("below 0.40") and "agrees" in verdict(0.35, 0.9)
    assert "does NOT agree" in verdict(0.35, 1.3)
    assert verdict(0.5, 1.2).startswith("0.40-0.60: moderate gain")
    assert verdict(0.6, 2.0).startswith("0.60 and above: strong gain") and "agrees" in verdict(0.6, 2.0)
    assert "does NOT agree" in verdict(0.7, 0.95)


def test_quantiles():
    assert quantiles([5.0]) == (5.0, 5.0, 5.0)
    assert quantiles([1.0, 3.0]) == (1.0, 2.0, 3.0)
    assert quantiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)


def test_summary_medians_ratios_and_acceptance():
    samples = [
        # prompt a: spec 30, 34 / base 20, 20 -> ratio 32/20 = 1.6
        sample("a", "code", True, 30.0, 100, accepted=30, drafted=50, spec_steps=10, histogram=[2, 2, 2, 2, 1, 1]),
        sample("a", "code", True, 34.0, 100, accepted=30, drafted=50, spec_steps=10, histogram=[2, 2, 2, 2, 1, 1]),
        sample("a", "code", False, 20.0, 100),
        sample("a", "code", False, 20.0, 100),
        # prompt b: spec 22 / base 22 -> ratio 1.0
        sample("b", "code", True, 22.0, 100, accepted=0, drafted=50, spec_steps=10, histogram=[10, 0, 0, 0, 0, 0]),
        sample("b", "code", False, 22.0, 100),
        sample("c", "chat", True, 10.0, 50, accepted=5, drafted=50, spec_steps=10, histogram=[6, 2, 1, 1, 0, 0]),
        sample("c", "chat", False, 20.0, 50),
    ]
    results = {r.category: r for r in summarize(samples, k=5, draft_cost=0.0)}
    code = results["code"]
    assert code.spec_tps[1] == 30.0 and code.base_tps[1] == 20.0
    assert code.speedup == pytest.approx(1.5)
    assert code.speedup_spread == (1.0, pytest.approx(1.3), 1.6)
    assert code.acceptance == pytest.approx(60 / 150)
    assert code.mean_acceptance_length == pytest.approx(1 + 60 / 30)
    # histogram summed: [14, 4, 4, 4, 2, 2] over 30 steps
    assert code.per_position == pytest.approx([16 / 30, 12 / 30, 8 / 30, 4 / 30, 2 / 30])
    assert code.ideal == pytest.approx(ideal_speedup(0.4, 5, 0.0))
    assert code.efficiency == pytest.approx(1.5 / code.ideal)
    chat = results["chat"]
    assert chat.speedup == 0.5 and chat.verdict.startswith("below 0.40") and "agrees" in chat.verdict
    chart = bar_chart([("", code), ("", chat)])
    assert "1.50x" in chart and "0.50x" in chart and "1.0x" in chart


def test_spec_bench_reader(tmp_path):
    path = tmp_path / "spec.jsonl"
    path.write_text(
        '{"question_id": 81, "category": "writing", "turns": ["Compose a travel blog post.", "Rewrite it."]}\n'
        "\n"
        '{"question_id": 82, "category": "coding", "turns": ["Write a sort function."]}\n'
    )
    prompts = prompt_sets.from_file(str(path))
    assert [(p.id, p.category, p.text) for p in prompts] == [("81", "writing", "Compose a travel blog post."), ("82", "coding", "Write a sort function.")]
    assert [p.id for p in prompt_sets.from_file(str(path), ["coding"])] == ["82"]
    path.write_text('{"question_id": 1, "category": "x", "turns": ["ok"]}\n{"question_id": 2, "turns": ["no category"]}\n')
    with pytest.raises(UserError, match=r"spec.jsonl:2: not a Spec-Bench line"):
        prompt_sets.from_file(str(path))


def test_builtin_sets_have_twelve_honest_prompts_per_category():
    prompts = prompt_sets.builtin()
    for category in prompt_sets.CATEGORIES:
        mine = [p for p in prompts if p.category == category]
        assert len(mine) >= 12, category
        assert len({p.text for p in mine}) == len(mine)
    # edits quote code, summaries and extractions carry their text
    assert sum("def " in p.text or "function " in p.text for p in prompts if p.category == "code") >= 8
    assert all(len(p.text) > 200 for p in prompts if p.category == "summarization")
    assert all(len(p.text) > 100 for p in prompts if p.category == "extraction")


def _sampled(speculative: bool, logprobs: list[float], category: str = "chat") -> list[Sample]:
    return [sample(f"p{i}", category, speculative, 20.0 + i % 3, 64, accepted=5, drafted=50, spec_steps=10, histogram=[5, 5, 0, 0, 0, 0], temperature=0.7, mean_logprob=lp) for i, lp in enumerate(logprobs)]


def test_a_category_where_speculation_changed_the_sampling_reports_no_speed_up():
    base = [-0.9, -1.1, -0.8, -1.0, -0.95, -0.85]
    broken = _sampled(True, [-2.9, -3.1, -2.7, -3.3, -2.8, -3.0]) + _sampled(False, base)
    sound = _sampled(True, [-0.92, -1.05, -0.83, -0.97, -1.0, -0.88], "creative") + _sampled(False, base, "creative")
    results = {r.category: r for r in summarize(broken + sound, 5, 0.0)}
    assert not results["chat"].lossless and results["chat"].lossless_t < -4.5
    assert results["chat"].verdict.startswith("NOT LOSSLESS")
    assert results["creative"].lossless and "NOT" not in results["creative"].verdict
    rows = [("", results["chat"]), ("", results["creative"])]
    chat_row = next(line for line in table(rows).splitlines() if line.startswith("chat"))
    assert "x " not in chat_row.split("NOT LOSSLESS")[0]  # no speed-up figure on the broken row
    assert "NOT LOSSLESS" in bar_chart(rows).splitlines()[0]
    assert "WARNING" in lossless_line(rows) and "chat" in lossless_line(rows).split("WARNING")[1]


def test_improbable_tokens_fail_a_category_the_mean_alone_would_pass():
    """What vLLM 0.32.0 did: the means stay close (t passes) while garbage tokens appear."""
    means = [-0.9, -1.1, -0.8, -1.0, -0.95, -0.85]

    def replies(speculative: bool, improbable: int) -> list[Sample]:
        return [sample(f"p{i}", "chat", speculative, 20.0, 64, accepted=5, drafted=50, spec_steps=10, temperature=0.7, mean_logprob=lp, improbable=improbable) for i, lp in enumerate(means)]

    (broken,) = summarize(replies(True, 4) + replies(False, 0), 5, 0.0)  # 24 of 384 tokens below -6, against none
    assert abs(broken.lossless_t) < 0.1 and broken.lossless_p < 1e-6
    assert not broken.lossless and "improbable tokens" in broken.verdict and broken.to_dict()["lossless"] is False
    assert "WARNING" in lossless_line([("", broken)]) and "p=" in lossless_line([("", broken)])
    (sound,) = summarize(replies(True, 1) + replies(False, 1), 5, 0.0)
    assert sound.lossless and sound.lossless_p > 0.1 and lossless_line([("", sound)]).endswith("all pass")


def test_greedy_replies_are_not_judged_by_log_probabilities():
    samples = [sample("a", "code", s, 20.0, 64, accepted=5, drafted=50, spec_steps=10, temperature=0.0) for s in (True, False) for _ in range(5)]
    (result,) = summarize(samples, 5, 0.0)
    assert result.lossless_t is None and result.lossless
    assert lossless_line([("", result)]) == ""


def test_an_adaptive_proposer_is_judged_by_tokens_per_step_against_the_step_cost():
    # suffix: a low acceptance rate (few of its many proposed tokens pass) yet a clear gain
    spec = [sample(f"p{i}", "code", True, 30.0, 101, accepted=40, drafted=200, spec_steps=40, steps=61) for i in range(4)]
    base = [sample(f"p{i}", "code", False, 20.0, 101, steps=101) for i in range(4)]
    (result,) = summarize(spec + base, 16, 0.0, method="suffix")
    assert result.acceptance == pytest.approx(0.2) and result.speedup == pytest.approx(1.5)
    assert result.tokens_per_step == pytest.approx(101 / 61)
    assert result.step_cost == pytest.approx((100 / 30 / 60) / (100 / 20 / 100))
    assert result.verdict.startswith("1.66 tokens per step") and "agrees" in result.verdict and "below 0.40" not in result.verdict
    assert result.ideal == pytest.approx(101 / 61) and result.efficiency < 1.0  # never "reached 120%"


def test_repeated_prompts_are_reported_apart_from_the_first_time():
    samples = [sample("a", "code", True, 30.0, 64, run=0), sample("a", "code", True, 120.0, 64, run=1), sample("a", "code", True, 118.0, 64, run=2)]
    samples += [sample("a", "code", False, 20.0, 64, run=r) for r in range(3)]
    (result,) = summarize(samples, 16, 0.0, method="suffix")
    assert result.speedup == pytest.approx(1.5) and result.repeat_speedup == pytest.approx(5.95)


def test_a_sharpened_category_fails():
    """The defect a one-sided check passed (vLLM's temperature read as 0: near-greedy
    replies, *more* probable than without speculation): the ranks' test sees it."""
    import numpy as np

    from termchat.engine.verify import stream_row

    from .test_verify import reply

    rng = np.random.default_rng(2)

    def replies(speculative: bool, temperature: float) -> list[Sample]:
        out = []
        for i in range(12):
            stream = reply(rng, f"p{i}", temperature=temperature)
            # no mean log-probability: the t-test is left out, the ranks' test alone must see it
            out.append(replace(sample(f"p{i}", "chat", speculative, 20.0, 60, accepted=5, drafted=50, spec_steps=10, temperature=0.7, improbable=0), rank_row=stream_row(stream)))
        return out

    (broken,) = summarize(replies(True, 0.35) + replies(False, 0.7), 5, 0.0)
    assert broken.lossless_rank_p < 0.002 and not broken.lossless and "ranks of the sampled tokens" in broken.verdict
    (sound,) = summarize(replies(True, 0.7) + replies(False, 0.7), 5, 0.0)
    assert sound.lossless_rank_p > 0.002 and sound.lossless


def test_the_roofline_counts_the_default_models_bytes_and_reads_them_against_the_bandwidth(prepared_model):
    from termchat.bench import roofline
    from termchat.profiles import builtin_profiles

    local = in_format(builtin_profiles()["local"], "float32")
    roof = roofline.for_profile(local)
    # SmolLM2-135M: 134,515,008 float32 weights; K and V of 30 layers x 3 heads x 64 dims
    assert roof.weight_bytes == 134_515_008 * 4 and roof.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4
    assert roofline.for_profile(replace(local, dtype="bfloat16")).weight_bytes == 134_515_008 * 2
    # served as its GGUF file: 30 layers of Q4_1 matrices (20 bytes per 32 weights) and the tied Q8_0 embedding as the output layer
    layer = (576 * 576 * 2 + 192 * 576 * 2 + 1536 * 576 * 3) // 32 * 20
    assert roofline.for_profile(in_format(local, "ggml")).weight_bytes == 30 * layer + 49152 * 576 // 32 * 34

    def plain(tps, prompt, output):
        stats = ReplyStats(decode_tokens_per_s=tps, prompt_tokens=prompt, output_tokens=output)
        return Sample("p", "code", False, stats)

    samples = [plain(20.0, 100, 200), plain(30.0, 100, 200), plain(25.0, 100, 200), Sample("p", "code", True, ReplyStats(decode_tokens_per_s=90.0))]
    line = roofline.report(local, samples, bandwidth=27e9)
    per_step = roof.weight_bytes + roof.kv_bytes_per_token * 200  # context: prompt + half the reply
    assert f"{25.0 * per_step / 27e9:.0%} of the limit" in line and "25.0 tok/s" in line  # the plain replies' median only
    assert roofline.for_profile(replace(local, endpoint="http://gpu:8000/v1")) is None
