#!/usr/bin/python3
"""Golden files for the Qwen2 family's C tests (tests/test_qwen2.c), from the
PyTorch reference qwen2_ref.py.

Run by hand (not in CI), with Debian's python3-torch:

  /usr/bin/python3 tests/reference/gen_qwen2.py tests/data

For each case below it writes tests/data/qwen2-<case>/ with config.json,
model.safetensors (F32, deliberately non-symmetric random weights: biases
and norm weights far from their init) and golden.safetensors holding

  input_ids, labels      [2, 12] I32 (labels: input_ids with a few -100)
  logits                 [2, 12, V] of the forward pass on input_ids
  loss                   [1] mean shifted cross-entropy against labels
  layers.{l}.*, final_hidden   intermediates, rows = the 24 tokens (names as
                         the C engine traces them)
  grad.<param>           gradient of loss for every parameter
  packed.input_ids, packed.position_ids, packed.segment_start, packed.labels
                         [1, 12]: two documents (5 and 7 tokens) in one row
  packed.loss, packed.final_hidden

Every float golden is computed in float64 (weights widened from the stored
float32 values) and rounded to F32; the same run in float32 is done alongside
and its deviation printed (max |d| over max |ref|, per tensor).
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402
import qwen2_ref as ref  # noqa: E402

# name: (hidden, intermediate, layers, heads, kv heads, vocab, tied, rope_theta, seed)
CASES = {
    "gqa1": (48, 80, 2, 4, 4, 160, False, 10000.0, 7101),   # one K/V head per query head
    "gqa2": (64, 96, 2, 4, 2, 192, True, 1000000.0, 7102),  # 2:1, tied embeddings
    "gqa7": (56, 64, 3, 7, 1, 128, True, 1000000.0, 7107),  # 7:1 as Qwen2.5 (one K/V head), tied
}
B, S = 2, 12
IGNORED = [(0, 0), (0, 5), (1, 3), (1, 11)]
DOCS = (5, 7)  # the packed row's documents


def config(case):
    D, I, L, H, Hkv, V, tied, theta, _ = CASES[case]
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": [1, 2],
        "hidden_act": "silu",
        "hidden_size": D,
        "initializer_range": 0.02,
        "intermediate_size": I,
        "max_position_embeddings": 64,
        "max_window_layers": L,
        "model_type": "qwen2",
        "num_attention_heads": H,
        "num_hidden_layers": L,
        "num_key_value_heads": Hkv,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": theta,
        "sliding_window": 64,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "transformers_version": "4.43.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": V,
    }


@torch.no_grad()
def init_nontrivial(model, gen):
    """Weights that make every part matter: Linear weights of variance 1/in,
    biases of 0.5, norm weights 1 ± 0.2, unit-variance embeddings."""
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
        elif name.endswith(".bias"):
            p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        elif name == "model.embed_tokens.weight":
            # tied, it is also lm_head: scaled so the logits are O(1), not O(√D)
            std = 2.0 / p.shape[1] ** 0.5 if model.cfg.tie_word_embeddings else 1.0
            p.copy_(std * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)


def f32(t):
    return t.detach().to(torch.float64).numpy().astype(np.float32)


def i32(t):
    return t.detach().numpy().astype(np.int32)


def dev(a, b):
    """max |a - b| / max |b| (float64)."""
    a, b = a.double(), b.double()
    m = b.abs().max().item()
    return (a - b).abs().max().item() / m if m else 0.0


def run(model, ids, labels):
    for p in model.parameters():
        p.grad = None
    rec = {}
    out = model(ids, record=rec)
    loss = model(ids, labels=labels)["loss"]
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return out["logits"].detach(), loss.detach(), {k: v.detach() for k, v in rec.items()}, grads


def packed_batch(V, gen):
    ids = torch.randint(0, V, (1, S), generator=gen)
    pos = torch.cat([torch.arange(n) for n in DOCS]).view(1, S)
    seg = torch.cat([torch.full((n,), sum(DOCS[:i])) for i, n in enumerate(DOCS)]).view(1, S)
    labels = ids.clone()
    labels[0, DOCS[0]] = -100  # the last token of document 1 does not predict document 2
    return ids, pos, seg, labels


def make_case(case, out_dir):
    cfgd = config(case)
    seed = CASES[case][-1]
    gen = torch.Generator().manual_seed(seed)
    model = ref.Qwen2ForCausalLM(ref.Config(cfgd))
    init_nontrivial(model, gen)
    mdir = os.path.join(out_dir, f"qwen2-{case}")
    ref.save_model(model, mdir, cfgd)
    m64 = ref.load_model(mdir, torch.float64)
    m32 = ref.load_model(mdir, torch.float32)

    V = cfgd["vocab_size"]
    ids = torch.randint(0, V, (B, S), generator=gen)
    labels = ids.clone()
    for b, s in IGNORED:
        labels[b, s] = -100
    lg64, loss64, rec64, g64 = run(m64, ids, labels)
    lg32, loss32, rec32, g32 = run(m32, ids, labels)

    pids, ppos, pseg, plab = packed_batch(V, gen)
    prec = {}
    with torch.no_grad():
        ploss = m64(pids, labels=plab, position_ids=ppos, segment_start=pseg, record=prec)["loss"]
        # the packed row equals its documents run separately
        off = 0
        for n in DOCS:
            r = {}
            m64(pids[:, off:off + n], record=r)
            d = (r["final_hidden"] - prec["final_hidden"][off:off + n]).abs().max().item()
            assert d < 1e-12, f"packed row differs from its document ({d})"
            off += n

    g = {"input_ids": i32(ids), "labels": i32(labels), "logits": f32(lg64),
         "loss": np.array([loss64.item()], dtype=np.float32)}
    for k, v in rec64.items():
        g[k] = f32(v)
    for n, v in g64.items():
        g["grad." + n] = f32(v)
    g["packed.input_ids"] = i32(pids)
    g["packed.position_ids"] = i32(ppos)
    g["packed.segment_start"] = i32(pseg)
    g["packed.labels"] = i32(plab)
    g["packed.loss"] = np.array([ploss.item()], dtype=np.float32)
    g["packed.final_hidden"] = f32(prec["final_hidden"])
    path = os.path.join(mdir, "golden.safetensors")
    st.save(path, g, metadata={"generator": "tests/reference/gen_qwen2.py", "case": case, "seed": str(seed),
                               "precision": "float64 reference rounded to F32"})

    worst_rec = max(dev(rec32[k], rec64[k]) for k in rec64)
    worst_grad = max((dev(g32[n], g64[n]), n) for n in g64)
    print(f"{path}: {sum(p.numel() for p in m64.parameters()):,} parameters, {os.path.getsize(path):,} bytes")
    print(f"  float32 vs float64: logits {dev(lg32, lg64):.2e}, intermediates <= {worst_rec:.2e}, "
          f"loss |d| {abs(loss32.item() - loss64.item()):.2e}, gradients <= {worst_grad[0]:.2e} ({worst_grad[1]})")
    print(f"  loss {loss64.item():.6f}, packed loss {ploss.item():.6f}, max |logit| {lg64.abs().max().item():.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", help="tests/data")
    ap.add_argument("--case", choices=sorted(CASES), action="append", help="only these cases (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    for case in args.case or sorted(CASES):
        make_case(case, args.out_dir)


if __name__ == "__main__":
    main()
