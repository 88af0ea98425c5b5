#!/usr/bin/python3
"""LoRA goldens for the C engine, from the PyTorch reference with a LoRA
written by hand (no PEFT: Debian has none).

Run by hand (not in CI), with Debian's python3-torch:

  /usr/bin/python3 tests/reference/gen_lora.py tests/data/tiny tests/data/lora-tiny

Every all-linear target of nanowhale (attn wq_a, wq_b, wkv, wo_a, wo_b; the
routed and shared experts' w1, w2, w3) gets an adapter through a weight
parametrisation W_eff = W + s * B @ A, s = alpha / r. That is LoRA exactly:
for a Linear, x @ W_eff.T = x @ W.T + s * (x @ A.T) @ B.T, and for wo_a,
which the model uses block-diagonally through its weight, it is the
effective-weight definition the engine documents. Dropout is 0 (the engine's
dropout masks are its own; they are tested in C).

Writes OUT/adapter_config.json + OUT/adapter_model.safetensors in PEFT's
layout (keys base_model.model.<module>.lora_A.weight [r, in] and
.lora_B.weight [out, r], F32; A and B both random so that B matters), and
OUT/golden.safetensors with, computed in float64 and rounded to F32:
input_ids, labels, logits, loss, and grad.<adapter key> for every A and B
(the gradient of the mean loss with the base frozen), plus merged_logits
(the logits of the base with W += s * B @ A, which must equal logits).
"""

import json
import os
import sys

import numpy as np
import torch
import torch.nn.utils.parametrize as P

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402
import nanowhale_ref as ref  # noqa: E402
import gen_grads as gg  # noqa: E402

RANK, ALPHA = 4, 8.0
TARGETS = ["wq_a", "wq_b", "wkv", "wo_a", "wo_b", "w1", "w2", "w3"]
SEED = 2024


class LoraDelta(torch.nn.Module):
    def __init__(self, A, B, scale):
        super().__init__()
        self.A = torch.nn.Parameter(A)
        self.B = torch.nn.Parameter(B)
        self.scale = scale

    def forward(self, W):
        return W + self.scale * (self.B @ self.A)


def targets(model):
    """(module path, nn.Linear) of every target, in named_modules order."""
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.split(".")[-1] in TARGETS:
            out.append((name, mod))
    return out


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    m64 = ref.load_model(model_dir, torch.float64)
    for p in m64.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(SEED)
    scale = ALPHA / RANK
    adapters = {}
    for name, lin in targets(m64):
        out_f, in_f = lin.weight.shape
        A = (torch.rand(RANK, in_f, generator=gen, dtype=torch.float64) * 2 - 1) / in_f ** 0.5
        B = (torch.rand(out_f, RANK, generator=gen, dtype=torch.float64) * 2 - 1) * 0.05
        A = A.float().double()   # the stored F32 values are the truth
        B = B.float().double()
        P.register_parametrization(lin, "weight", LoraDelta(A, B, scale))
        adapters[name] = lin.parametrizations.weight[0]

    ids, labels = gg.make_batch(m64.cfg.vocab_size, gg.DEFAULT_SEED)
    outd = m64(ids, labels=labels)
    loss, logits = outd["loss"], outd["logits"]
    loss.backward()

    tensors, golden = {}, {"input_ids": gg.i32(ids), "labels": gg.i32(labels),
                           "logits": gg.f32(logits), "loss": np.array([loss.item()], dtype=np.float32)}
    for name, d in adapters.items():
        key = f"base_model.model.{name}"
        tensors[key + ".lora_A.weight"] = gg.f32(d.A)
        tensors[key + ".lora_B.weight"] = gg.f32(d.B)
        golden["grad." + key + ".lora_A.weight"] = gg.f32(d.A.grad)
        golden["grad." + key + ".lora_B.weight"] = gg.f32(d.B.grad)

    # merged: the same weights baked in, adapters removed
    with torch.no_grad():
        for name, lin in targets(m64):
            P.remove_parametrizations(lin, "weight", leave_parametrized=True)
        golden["merged_logits"] = gg.f32(m64(ids)["logits"])

    st.save(os.path.join(out, "adapter_model.safetensors"), tensors)
    st.save(os.path.join(out, "golden.safetensors"), golden)
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA,
           "lora_dropout": 0.0, "use_rslora": False, "bias": "none",
           "target_modules": TARGETS, "base_model_name_or_path": "tests/data/tiny",
           "fan_in_fan_out": False, "inference_mode": True}
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    print(f"{len(adapters)} adapters, loss {loss.item():.6f}, "
          f"max |merged - adapted| {float((golden['merged_logits'] - golden['logits']).__abs__().max()):.3g}")


if __name__ == "__main__":
    main()
