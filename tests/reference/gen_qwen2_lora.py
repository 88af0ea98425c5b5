#!/usr/bin/python3
"""LoRA goldens for the Qwen2 family (tests/test_qwen2.c), from the PyTorch
reference qwen2_ref.py with a LoRA written by hand (Debian has no PEFT).

Run by hand (not in CI), with Debian's python3-torch:

  /usr/bin/python3 tests/reference/gen_qwen2_lora.py tests/data/qwen2-gqa2 tests/data/qwen2-lora

Every all-linear target of Qwen2 (q_proj, k_proj, v_proj, o_proj, gate_proj,
up_proj, down_proj; not lm_head) gets an adapter through a weight
parametrisation W_eff = W + s * B @ A. For a Linear that is LoRA exactly:
x @ W_eff.T + b = W x + b + s * B (A x). Rank 4, alpha 8, dropout 0,
s = alpha / r = 2 (rsLoRA: alpha / sqrt(r) = 4). A and B are both random and
non-zero, so that B, A and the scale all matter.

Writes, for the base model BASE (the script reads it, it does not change it):

  OUT/adapter_config.json, OUT/adapter_model.safetensors
      PEFT's layout: keys base_model.model.<module>.lora_A.weight [r, in] and
      .lora_B.weight [out, r], F32; use_rslora false
  OUT/rslora/adapter_config.json, OUT/rslora/adapter_model.safetensors
      the same tensors with use_rslora true
  OUT/golden.safetensors, computed in float64 (weights, A and B widened from
  their stored F32 values) and rounded to F32:
      input_ids, labels        [2, 12] I32 (labels unshifted, -100 ignored)
      logits                   [2, 12, V] of the adapted model
      loss                     [1] mean shifted cross-entropy against labels
      grad.<adapter key>       d loss / d A and d B for every adapter, the
                               base frozen (key = the adapter file's key)
      merged_logits            [2, 12, V]: the base with W += s * B @ A
                               (float64), adapters removed
      rslora.logits, rslora.loss, rslora.grad.<adapter key>
                               the same with s = alpha / sqrt(r)

A float32 run of the same computation is done alongside and its deviation
printed, as is how much each single adapter moves the logits (so that a C
engine that drops or mis-scales any one of them fails the test).
"""

import json
import os
import sys

import numpy as np
import torch
import torch.nn.utils.parametrize as P

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402
import qwen2_ref as ref  # noqa: E402
import gen_qwen2 as gq  # noqa: E402

RANK, ALPHA = 4, 8.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SEED = 4242
B_SCALE = 0.1  # B ~ U(-0.1, 0.1); A ~ U(-1/sqrt(in), 1/sqrt(in)) as PEFT initialises it


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
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and n.split(".")[-1] in TARGETS]


def make_adapters(model_dir):
    """A, B (float32-representable float64 tensors) for every target."""
    m = ref.load_model(model_dir, torch.float64)
    gen = torch.Generator().manual_seed(SEED)
    out = {}
    for name, lin in targets(m):
        out_f, in_f = lin.weight.shape
        A = (torch.rand(RANK, in_f, generator=gen, dtype=torch.float64) * 2 - 1) / in_f ** 0.5
        B = (torch.rand(out_f, RANK, generator=gen, dtype=torch.float64) * 2 - 1) * B_SCALE
        out[name] = (A.float().double(), B.float().double())  # the stored F32 values are the truth
    return out


def adapted(model_dir, adapters, dtype):
    """The base in dtype, frozen, with every adapter attached (scale alpha / r)."""
    m = ref.load_model(model_dir, dtype)
    for p in m.parameters():
        p.requires_grad_(False)
    deltas = {}
    for name, lin in targets(m):
        A, B = adapters[name]
        P.register_parametrization(lin, "weight", LoraDelta(A.to(dtype), B.to(dtype), ALPHA / RANK))
        deltas[name] = lin.parametrizations.weight[0]
    return m, deltas


def step(m, deltas, ids, labels, scale):
    """logits, loss and {key: grad} of the mean loss at the given scale."""
    for d in deltas.values():
        d.scale = scale
        d.A.grad = d.B.grad = None
    logits = m(ids)["logits"].detach()
    loss = m(ids, labels=labels)["loss"]
    loss.backward()
    grads = {}
    for name, d in deltas.items():
        key = f"base_model.model.{name}"
        grads[key + ".lora_A.weight"] = d.A.grad.detach().clone()
        grads[key + ".lora_B.weight"] = d.B.grad.detach().clone()
    return logits, loss.detach(), grads


def rel_norm(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def write_adapter(out, tensors, rslora, base):
    os.makedirs(out, exist_ok=True)
    st.save(os.path.join(out, "adapter_model.safetensors"), tensors)
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA,
           "lora_dropout": 0.0, "use_rslora": rslora, "bias": "none",
           "target_modules": TARGETS, "base_model_name_or_path": base,
           "fan_in_fan_out": False, "inference_mode": True}
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    model_dir, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    adapters = make_adapters(model_dir)
    m64, d64 = adapted(model_dir, adapters, torch.float64)
    m32, d32 = adapted(model_dir, adapters, torch.float32)

    V = m64.cfg.vocab_size
    gen = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(0, V, (gq.B, gq.S), generator=gen)
    labels = ids.clone()
    for b, s in gq.IGNORED:
        labels[b, s] = -100

    s_lora, s_rs = ALPHA / RANK, ALPHA / RANK ** 0.5
    # the parametrisation is the LoRA formula y = W x + b + s * B (A x), on every target
    with torch.no_grad():
        x = torch.randn(5, m64.cfg.intermediate_size, generator=gen, dtype=torch.float64)
        base = ref.load_model(model_dir, torch.float64)
        for (name, lin), (_, lin0) in zip(targets(m64), targets(base)):
            A, B = adapters[name]
            xi = x[:, :lin0.in_features]
            want = lin0(xi) + s_lora * (xi @ A.T) @ B.T
            assert (lin(xi) - want).abs().max().item() < 1e-12 * want.abs().max().item(), name
    lg, loss, grads = step(m64, d64, ids, labels, s_lora)
    rlg, rloss, rgrads = step(m64, d64, ids, labels, s_rs)
    lg32, loss32, grads32 = step(m32, d32, ids, labels, s_lora)
    rlg32, rloss32, rgrads32 = step(m32, d32, ids, labels, s_rs)

    # how much each adapter matters: logits with that one adapter's scale at 0
    with torch.no_grad():
        for d in d64.values():
            d.scale = 0.0
        base_lg = m64(ids)["logits"]
        for d in d64.values():
            d.scale = s_lora
        effect = {}
        for name, d in d64.items():
            d.scale = 0.0
            effect[name] = gq.dev(m64(ids)["logits"], lg)
            d.scale = s_lora
        # merged: the same weights baked in (float64), adapters removed
        for name, lin in targets(m64):
            P.remove_parametrizations(lin, "weight", leave_parametrized=True)
        merged = m64(ids)["logits"]

    golden = {"input_ids": gq.i32(ids), "labels": gq.i32(labels), "logits": gq.f32(lg),
              "loss": np.array([loss.item()], dtype=np.float32), "merged_logits": gq.f32(merged),
              "rslora.logits": gq.f32(rlg), "rslora.loss": np.array([rloss.item()], dtype=np.float32)}
    tensors = {}
    for name, (A, B) in adapters.items():
        key = f"base_model.model.{name}"
        tensors[key + ".lora_A.weight"] = gq.f32(A)
        tensors[key + ".lora_B.weight"] = gq.f32(B)
    for k, g in grads.items():
        golden["grad." + k] = gq.f32(g)
    for k, g in rgrads.items():
        golden["rslora.grad." + k] = gq.f32(g)

    base = os.path.relpath(os.path.abspath(model_dir), os.getcwd())
    write_adapter(out, tensors, False, base)
    write_adapter(os.path.join(out, "rslora"), tensors, True, base)
    path = os.path.join(out, "golden.safetensors")
    st.save(path, golden, metadata={
        "generator": "tests/reference/gen_qwen2_lora.py", "model_dir": base, "seed": str(SEED),
        "r": str(RANK), "lora_alpha": repr(ALPHA), "precision": "float64 reference rounded to F32",
        "loss_f64": repr(loss.item()), "rslora_loss_f64": repr(rloss.item())})

    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(out) for f in fs)
    print(f"{len(adapters)} adapters, {sum(a.numel() + b.numel() for a, b in adapters.values()):,} parameters; "
          f"{out}: {total:,} bytes")
    print(f"loss {loss.item():.7f}, rsLoRA loss {rloss.item():.7f}; max |logit| {lg.abs().max().item():.3f}; "
          f"adapters vs base logits {gq.dev(base_lg, lg):.2e} of max |logit|")
    worst = min(effect.items(), key=lambda kv: kv[1])
    print(f"removing one adapter moves the logits by >= {worst[1]:.2e} of max |logit| ({worst[0]}); "
          f"rsLoRA vs LoRA logits {gq.dev(rlg, lg):.2e}")
    print(f"merged vs adapted (float64): {gq.dev(merged, lg):.2e}")
    print(f"float32 vs float64: logits {gq.dev(lg32, lg):.2e} (rsLoRA {gq.dev(rlg32, rlg):.2e}), "
          f"loss |d| {abs(loss32.item() - loss.item()):.2e} (rsLoRA {abs(rloss32.item() - rloss.item()):.2e}), "
          f"adapter gradients <= {max(rel_norm(grads32[k], grads[k]) for k in grads):.2e} "
          f"(rsLoRA {max(rel_norm(rgrads32[k], rgrads[k]) for k in rgrads):.2e}) norm-relative")


if __name__ == "__main__":
    main()
