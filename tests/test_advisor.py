"""The advisor on profiles that trigger each rule, and on ones that avoid it."""

from __future__ import annotations

from termchat.profiles.advisor import Gpu, check
from termchat.profiles import parse_config

TWO_A100 = [Gpu("A100-80GB", 81920, 80000), Gpu("A100-80GB", 81920, 80000)]
ONE_24GB = [Gpu("RTX 4090", 24576, 23000)]


def profile(body: str, spec: str = ""):
    text = f"[profiles.p]\n{body}\n" + (f"[profiles.p.speculative]\n{spec}\n" if spec else "")
    config, problems = parse_config(text, "t.toml")
    assert not problems, problems
    return config.profiles["p"]


def rules(p, gpu_list):
    return {f.rule for f in check(p, gpu_list) if f.level == "warning"}


ARTICLE = profile(
    'model = "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"\nquantization = "awq"\ntensor_parallel_size = 2\ntemperature = 0.7',
    'method = "draft_model"\nmodel = "meta-llama/Llama-3.1-8B-Instruct"\nnum_speculative_tokens = 5',
)


def test_the_articles_setup_on_two_gpus_passes_every_rule():
    assert rules(ARTICLE, TWO_A100) == set()
    assert any(f.rule == "memory" and "they fit" in f.message for f in check(ARTICLE, TWO_A100))


def test_memory_case_1_both_must_fit():
    found = check(ARTICLE, ONE_24GB)
    assert "memory (case 1)" in {f.rule for f in found}
    message = next(f.message for f in found if f.rule == "memory (case 1)")
    assert "both must fit" in message and "GiB" in message


def test_temperature_case_2():
    hot = profile('model = "meta-llama/Llama-3.1-70B-Instruct"\ntemperature = 0.9', 'method = "ngram"\nnum_speculative_tokens = 5')
    cool = profile('model = "meta-llama/Llama-3.1-70B-Instruct"\ntemperature = 0.7', 'method = "ngram"\nnum_speculative_tokens = 5')
    assert "temperature (case 2)" in rules(hot, TWO_A100)
    assert "temperature (case 2)" not in rules(cool, TWO_A100)


def test_size_case_3_target_and_draft_on_gpu_only():
    small = profile('model = "meta-llama/Llama-3.1-8B-Instruct"', 'method = "draft_model"\nmodel = "meta-llama/Llama-3.2-1B-Instruct"\nnum_speculative_tokens = 5')
    assert "target size (case 3)" in rules(small, TWO_A100)
    big_draft = profile('model = "meta-llama/Llama-3.1-70B-Instruct"\nquantization = "awq"\ntensor_parallel_size = 2', 'method = "draft_model"\nmodel = "meta-llama/Llama-3.1-13B-Instruct"\nnum_speculative_tokens = 5')
    assert "draft size (case 3)" in rules(big_draft, TWO_A100)
    assert "draft size (case 3)" not in rules(ARTICLE, TWO_A100)
    # a CPU profile is left to the bench
    cpu = profile('model = "meta-llama/Llama-3.1-8B-Instruct"\nenv = { VLLM_CPU_KVCACHE_SPACE = "1" }', 'method = "draft_model"\nmodel = "meta-llama/Llama-3.2-1B-Instruct"\nnum_speculative_tokens = 5')
    assert not {"target size (case 3)", "draft size (case 3)"} & rules(cpu, [])


def test_vocabulary_families_and_the_heterogeneous_opt_in():
    mixed = profile('model = "meta-llama/Llama-3.1-70B-Instruct"\nquantization = "awq"\ntensor_parallel_size = 2', 'method = "draft_model"\nmodel = "Qwen/Qwen2.5-0.5B-Instruct"\nnum_speculative_tokens = 5')
    assert "vocabulary" in rules(mixed, TWO_A100)
    allowed = profile('model = "meta-llama/Llama-3.1-70B-Instruct"\nquantization = "awq"\ntensor_parallel_size = 2', 'method = "draft_model"\nmodel = "Qwen/Qwen2.5-0.5B-Instruct"\nnum_speculative_tokens = 5\nuse_heterogeneous_vocab = true')
    assert "vocabulary" not in rules(allowed, TWO_A100)
    assert "vocabulary" not in rules(ARTICLE, TWO_A100)


def test_more_than_seven_speculative_tokens():
    many = profile('model = "meta-llama/Llama-3.1-70B-Instruct"', 'method = "ngram"\nnum_speculative_tokens = 9')
    assert "speculative tokens" in rules(many, TWO_A100)
    assert "speculative tokens" not in rules(ARTICLE, TWO_A100)


def test_no_gpu():
    builtin = parse_config("", "t.toml")[0].profiles["local"]
    assert rules(builtin, []) == set()
    assert any("runs on the CPU" in f.message for f in check(builtin, []))
    assert "hardware" in rules(ARTICLE, [])  # a GPU profile on a machine without one


def test_the_band_fits_the_method():
    from termchat.profiles.advisor import band

    # fixed-k methods: the article's acceptance bands
    assert band("draft_model", 0.35)[0] == "low" and band("eagle3", 0.5)[0] == "moderate" and band("mtp", 0.7)[0] == "strong"
    # ngram and suffix: tokens per step against the measured cost of a step, whatever their acceptance
    assert band("suffix", 0.2, tokens_per_step=2.4, step_cost=1.3)[0] == "strong"
    assert band("ngram", 0.9, tokens_per_step=1.3, step_cost=1.6)[0] == "low"
    level, words = band("suffix", 0.2, tokens_per_step=2.4)
    assert level is None and "termchat bench" in words  # no colour until the step cost is measured
