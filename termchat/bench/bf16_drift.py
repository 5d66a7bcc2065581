"""Does a bfloat16 vLLM engine drift from float32 layer by layer, and transformers not?

    python -m termchat.bench.bf16_drift [--prompt 7]

One built-in prompt with a 64-token greedy reply (from a float32 engine of
transformers, the reference) runs once through transformers in float32 and
bfloat16 and once through vLLM's bfloat16 model (eager, in this process);
each decoder layer's output (vLLM's hidden + residual) is compared with
float32's. transformers' bfloat16 error stays near 1e-2 through the layers;
where vLLM's CPU kernels truncate to bfloat16 (no AVX512-BF16; see
`python -m termchat.bench.kernels`) its error grows every layer instead.
Last, the relative error each of vLLM's layer-5 steps adds to its own inputs,
beside one bfloat16 rounding of the exact result: the step that adds more,
with an error shared by every position (a bias), is the one that drifts.
"""

from __future__ import annotations

import argparse
import math
import os


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m termchat.bench.bf16_drift", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=7, help="which of the 20 guard prompts (4 per category)")
    args = parser.parse_args(argv)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the model in this process, for the hooks
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from termchat import models
    from termchat.bench.command import machine_line
    from termchat.bench.prompt_sets import builtin

    path = str(models.folder("termchat:smollm2-135m-instruct"))
    by: dict[str, list] = {}
    for p in builtin():
        by.setdefault(p.category, []).append(p.text)
    prompt = [t for texts in by.values() for t in texts[:4]][args.prompt]
    tok = AutoTokenizer.from_pretrained(path)
    user = [{"role": "user", "content": prompt}]
    ref_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    head = tok.apply_chat_template(user, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        ids = ref_model.generate(head, max_new_tokens=64, do_sample=False)[0].tolist()
    print(machine_line())
    print(f"prompt {args.prompt}: {len(ids)} tokens ({len(ids) - head.shape[1]} of float32's greedy reply)")

    def layer_outputs(model) -> list:
        outs: list = []
        hooks = [layer.register_forward_hook(lambda m, a, o: outs.append((o[0] if isinstance(o, tuple) else o)[0].double())) for layer in model.model.layers]
        with torch.no_grad():
            model(torch.tensor([ids]))
        for h in hooks:
            h.remove()
        return outs

    f32 = layer_outputs(ref_model)
    b16 = layer_outputs(AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval())

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(path, dtype="bfloat16", enforce_eager=True, kv_cache_memory_bytes=1 << 28, distributed_executor_backend="uni")
    model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    n = len(ids)
    outs: list = []
    for layer in model.model.layers:  # a vLLM layer returns (hidden, residual); their sum is the layer's output
        layer.register_forward_hook(lambda m, a, o: outs.append((o[0].double() + (o[1].double() if o[1] is not None else 0))[:n]))
    steps: dict = {}
    five = model.model.layers[5]
    parts = {"input norm (+ residual)": five.input_layernorm, "qkv": five.self_attn.qkv_proj, "o": five.self_attn.o_proj,
             "post-attention norm (+ residual)": five.post_attention_layernorm, "gate_up": five.mlp.gate_up_proj, "down": five.mlp.down_proj}
    for name, module in parts.items():
        module.register_forward_pre_hook(lambda m, a, name=name: steps.setdefault(name, [[t.clone() if torch.is_tensor(t) else t for t in a]]) and None)
        # clones: the norms work in place, and the next layer's norm rewrites the residual
        module.register_forward_hook(lambda m, a, o, name=name: steps[name].append([t.clone() if torch.is_tensor(t) else t for t in (o if isinstance(o, tuple) else (o,))]) if len(steps[name]) == 1 else None)
    llm.generate(TokensPrompt(prompt_token_ids=ids), SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)

    rel = lambda x, ref: float((x - ref).norm() / ref.norm())  # noqa: E731
    print("\nrelative error of each layer's output against float32 (transformers):")
    print("layer  transformers bf16  vLLM bf16")
    for k, ref in enumerate(f32):
        print(f"{k:5d}  {rel(b16[k], ref):17.2e}  {rel(outs[k], ref):9.2e}")

    print("\nvLLM layer 5, each step against its exact result on the same inputs:")
    print(f"{'step':38} {'error':>9} {'one rounding':>13} {'shared by positions':>20}")

    def show(name, got, exact):
        got, exact = got[:n].detach().double(), exact[:n].detach().double()
        shared = (got - exact).mean(0).norm() * math.sqrt(n) / exact.norm()
        print(f"{name:38} {rel(got, exact):9.2e} {rel(exact.bfloat16().double(), exact):13.2e} {float(shared):20.2e}")

    for name, module in parts.items():
        (inputs, outputs) = steps[name]
        if "norm" in name:
            total = inputs[0].double() + inputs[1].double()
            show(name.replace(" (+ residual)", ": the residual sum"), outputs[1], total)
            norm = total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + module.variance_epsilon) * module.weight.detach().double()
            show(name.replace(" (+ residual)", ""), outputs[0], norm)
        else:
            show(name, outputs[0], inputs[0].double() @ module.weight.detach().double().t())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
