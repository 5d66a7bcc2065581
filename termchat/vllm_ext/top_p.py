"""Top-p (nucleus) sampling's mask without sorting the vocabulary.

vLLM's CPU sampler applies top-p by sorting every row of the logits
(`apply_top_k_top_p_pytorch`): torch's CPU sort of the default's 49,152
logits takes 3.2 ms, and a plain step 9-10 ms, so a chat reply at the
built-ins' top_p = 0.95 decoded at 65-68 tok/s where top_p = 1 gave 89-101
(bench README, "Top-p without the sort"). The nucleus is a few dozen tokens,
so `nucleus_mask` takes the largest probabilities with `topk`, widening until
the first token not taken is cut (64, 256, ... up to the vocabulary), and
applies vLLM's rule in vLLM's arithmetic. It removes the tokens vLLM removes
but where vLLM's own rounding or its unstable sort decides: a token whose
running sum is within float32's step of 1 - p, or one of two tokens with the
same logit across the cut (4 of 3,000 random rows; tests/test_sampling_kernels).
Only the mask is replaced: the sampler, the seeds and the rejection sampler's
verdicts are vLLM's and termchat's as before, and the plain and the
speculative path share this one function, so speculation still changes
nothing that is sampled.

Top-k with top-p, and anything but float CPU logits, go to vLLM's function.
TERMCHAT_FAST_TOP_P=0 turns it off. Torch and vLLM only (the engine imports it).
"""

from __future__ import annotations

FIRST = 64  # tokens taken first: at T = 0.7 and p = 0.95 the nucleus rarely holds more
WIDEN = 4  # then 4x as many, until they hold p


def nucleus_mask(logits, p):
    """True where top-p removes a token: logits [rows, vocab] (float), p [rows].

    vLLM's rule, in its arithmetic: sort a row's probabilities ascending, take
    their running sum in float32 (torch sums in double on the CPU and rounds each
    sum), and remove a token where that sum is <= 1 - p (float32), never the most
    probable. A token's running sum is the row's total less the mass above it, so
    only the tokens above the cut need to be found: `topk` of FIRST, then WIDEN
    times as many, until the first token not taken is removed. A row with p >= 1
    removes only tokens of probability 0, as vLLM's sum of 0 <= 0 does."""
    import torch

    rows, vocab = logits.shape
    probs = logits.softmax(dim=-1)
    total = probs.sum(dim=-1, dtype=torch.float64).unsqueeze(1)
    limit = (1 - p).to(probs.dtype).unsqueeze(1)  # as vLLM computes it
    limited = (p < 1).unsqueeze(1)
    take = min(FIRST, vocab)
    while True:
        top, index = probs.topk(take, dim=-1)  # sorted, largest first
        below_cut = (total - top.sum(dim=-1, dtype=torch.float64).unsqueeze(1)).to(probs.dtype) <= limit  # the first token not taken
        if take >= vocab or bool((below_cut | ~limited).all()):
            break
        take = min(vocab, take * WIDEN)
    above = top.to(torch.float64).cumsum(dim=-1) - top.to(torch.float64)
    keep = (total - above).to(probs.dtype) > limit  # vLLM's running sum at each token, over the cut
    keep[:, 0] = True
    removed = torch.ones((rows, vocab), dtype=torch.bool, device=logits.device)
    removed.scatter_(1, index, ~keep)
    return torch.where(limited, removed, probs == 0)


def install() -> bool:
    """Replace vLLM's top-k/top-p function where its CPU sampler and its rejection
    sampler call it, for top-p without top-k. False where there is nothing to do."""
    try:
        from vllm.platforms import current_platform
        from vllm.v1.sample import rejection_sampler
        from vllm.v1.sample.ops import topk_topp_sampler
    except ImportError:
        return False
    vllms = topk_topp_sampler.apply_top_k_top_p
    if not current_platform.is_cpu() or getattr(vllms, "termchat", False):
        return False

    def apply_top_k_top_p(logits, k, p):
        if p is None or k is not None or logits.dim() != 2 or not logits.dtype.is_floating_point or logits.device.type != "cpu":
            return vllms(logits, k, p)
        return logits.masked_fill_(nucleus_mask(logits, p), -float("inf"))

    apply_top_k_top_p.termchat = True
    apply_top_k_top_p.vllm = vllms  # the function it stands in for (tests compare the two)
    topk_topp_sampler.apply_top_k_top_p = apply_top_k_top_p
    rejection_sampler.apply_top_k_top_p = apply_top_k_top_p
    return True
