#!/usr/bin/python3
"""LoRA goldens for the C engine, from the PyTorch reference with PEFT's
semantics written by hand (no PEFT: Debian has none).

Run by hand (not in CI), with Debian's python3-torch:

  /usr/bin/python3 tests/reference/gen_lora.py tests/data/tiny tests/data/lora-tiny

PEFT's "all-linear" (ms-swift's find_all_linears) wraps every nn.Linear of
the model but lm_head: nanowhale's attn wq_a, wq_b, wkv, wo_a, wo_b and the
routed and shared experts' w1, w2, w3. A PEFT LoRA layer acts only when its
forward is called: y = x @ W.T + s * (x @ A.T) @ B.T, s = alpha / r. The
reference (like the original modeling code) never calls wo_a: it reads
wo_a.weight inside its grouped product, so under PeftModel an adapter on
wo_a changes nothing. The adapters here are forward hooks, which act exactly
where PEFT's wrappers act, and the script checks that the modules whose
forward runs are those whale's all-linear selects (wo_a left out). The
adapter file has every all-linear module, wo_a included with a nonzero B, as
PEFT writes it: whale must read past wo_a's pair and compute what PeftModel
computes. Dropout is 0 (the engine's dropout masks are its own; they are
tested in C).

Writes OUT/adapter_config.json + OUT/adapter_model.safetensors in PEFT's
layout (keys base_model.model.<module>.lora_A.weight [r, in] and
.lora_B.weight [out, r], F32; A and B both random so that B matters), and
OUT/golden.safetensors with, computed in float64 and rounded to F32:
input_ids, labels, logits, loss, and grad.<adapter key> for every A and B of
a called module (the gradient of the mean loss with the base frozen), plus
merged_logits (the logits of the base with W += s * B @ A on the called
modules, which must equal logits).
"""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402
import nanowhale_ref as ref  # noqa: E402
import gen_grads as gg  # noqa: E402

RANK, ALPHA = 4, 8.0
ALL_LINEAR = ["wq_a", "wq_b", "wkv", "wo_a", "wo_b", "w1", "w2", "w3"]  # PEFT's all-linear on nanowhale
CALLED = ["wq_a", "wq_b", "wkv", "wo_b", "w1", "w2", "w3"]  # whale's all-linear: the Linears the forward calls
SEED = 2024


def targets(model):
    """(module path, nn.Linear) of every all-linear module, in named_modules order."""
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.split(".")[-1] in ALL_LINEAR:
            out.append((name, mod))
    return out


def lora_hook(A, B, scale, name, called):
    """PEFT's LoRA layer as a forward hook: it acts on calls only."""
    def hook(mod, inputs, output):
        called.add(name)
        return output + scale * (inputs[0] @ A.T) @ B.T
    return hook


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    m64 = ref.load_model(model_dir, torch.float64)
    for p in m64.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(SEED)
    scale = ALPHA / RANK
    adapters, hooks, called = {}, [], set()
    for name, lin in targets(m64):
        out_f, in_f = lin.weight.shape
        A = (torch.rand(RANK, in_f, generator=gen, dtype=torch.float64) * 2 - 1) / in_f ** 0.5
        B = (torch.rand(out_f, RANK, generator=gen, dtype=torch.float64) * 2 - 1) * 0.05
        A = torch.nn.Parameter(A.float().double())   # the stored F32 values are the truth
        B = torch.nn.Parameter(B.float().double())
        hooks.append(lin.register_forward_hook(lora_hook(A, B, scale, name, called)))
        adapters[name] = (A, B)

    ids, labels = gg.make_batch(m64.cfg.vocab_size, gg.DEFAULT_SEED)
    outd = m64(ids, labels=labels)
    loss, logits = outd["loss"], outd["logits"]
    loss.backward()
    called_kinds = sorted({n.split(".")[-1] for n in called})
    assert called_kinds == sorted(CALLED), f"the forward calls {called_kinds}, whale's all-linear is {CALLED}"
    assert all(A.grad is None for n, (A, B) in adapters.items() if n not in called)

    tensors, golden = {}, {"input_ids": gg.i32(ids), "labels": gg.i32(labels),
                           "logits": gg.f32(logits), "loss": np.array([loss.item()], dtype=np.float32)}
    for name, (A, B) in adapters.items():
        key = f"base_model.model.{name}"
        tensors[key + ".lora_A.weight"] = gg.f32(A)
        tensors[key + ".lora_B.weight"] = gg.f32(B)
        if name in called:
            golden["grad." + key + ".lora_A.weight"] = gg.f32(A.grad)
            golden["grad." + key + ".lora_B.weight"] = gg.f32(B.grad)

    # merged: the called modules' deltas baked in, hooks removed (what whale's
    # export writes); PEFT's merge_and_unload would also bake wo_a's in
    for h in hooks:
        h.remove()
    with torch.no_grad():
        for name, lin in targets(m64):
            A, B = adapters[name]
            if name in called:
                lin.weight += scale * (B @ A)
        golden["merged_logits"] = gg.f32(m64(ids)["logits"])
        for name, lin in targets(m64):
            A, B = adapters[name]
            if name not in called:
                lin.weight += scale * (B @ A)
        peft_merged = gg.f32(m64(ids)["logits"])

    st.save(os.path.join(out, "adapter_model.safetensors"), tensors)
    st.save(os.path.join(out, "golden.safetensors"), golden)
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA,
           "lora_dropout": 0.0, "use_rslora": False, "bias": "none",
           "target_modules": ALL_LINEAR, "base_model_name_or_path": "tests/data/tiny",
           "fan_in_fan_out": False, "inference_mode": True}
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    print(f"{len(adapters)} adapters in the file, {len(called)} called, loss {loss.item():.6f}, "
          f"max |merged - adapted| {float(abs(golden['merged_logits'] - golden['logits']).max()):.3g}, "
          f"max |merge with wo_a - adapted| (PEFT's merge_and_unload) {float(abs(peft_merged - golden['logits']).max()):.3g}")


if __name__ == "__main__":
    main()
