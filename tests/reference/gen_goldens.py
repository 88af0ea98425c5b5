#!/usr/bin/python3
"""Generate golden files for the C tests from the PyTorch reference model.

Run by hand (not in CI), with Debian's python3-torch:

  /usr/bin/python3 tests/reference/gen_goldens.py tiny tests/data/tiny tests/data/golden-tiny.safetensors
  /usr/bin/python3 tests/reference/gen_goldens.py tiny tests/data/tiny-variant \
        tests/data/golden-tiny-variant.safetensors --variant
  /usr/bin/python3 tests/reference/gen_goldens.py debug MODEL_DIR GOLDEN_FILE

`tiny` creates a small model directory (config.json + model.safetensors, all
F32) with deliberately non-symmetric random weights, then writes its golden
file.  `debug` reads an existing checkpoint (the C engine's
`whale init --preset debug --seed 1`) and writes a compact golden file.

All float goldens are computed in float64 (weights widened from the stored
float32 values, RoPE table in float64) and rounded to F32; the same run in
float32 is done alongside and its deviation printed (see README.md).  The
routing indices and greedy tokens must agree between the two runs, otherwise
the script fails.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402
import nanowhale_ref as ref  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False


# ----------------------------------------------------------------- configs

def full_config(core):
    """config.json with every field a real nanowhale checkpoint carries,
    the inert ones included (spec 1.1/1.2)."""
    L = core["num_hidden_layers"]
    c = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_deepseek_v4.DeepseekV4Config",
            "AutoModelForCausalLM": "modeling_deepseek_v4.DeepseekV4ForCausalLM",
        },
        "model_type": "deepseek_v4",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": None,
        "compress_ratios": [0] * (L + 1),
        "compress_rope_theta": 160000.0,
        "hidden_act": "silu",
        "index_head_dim": 128,
        "index_n_heads": 64,
        "index_topk": 512,
        "nope_head_dim": core["head_dim"] - core["qk_rope_head_dim"],
        "norm_topk_prob": True,
        "num_nextn_predict_layers": 1,
        "rope_scaling": None,
        "sliding_window": 128,
        "topk_method": "noaux_tc",
        "use_cache": True,
        "dtype": "float32",
        "transformers_version": "5.8.0",
        "output_hidden_states": False,
        "output_attentions": False,
        "return_dict": True,
        "chunk_size_feed_forward": 0,
        "is_encoder_decoder": False,
        "problem_type": None,
    }
    c.update(core)
    return dict(sorted(c.items()))


def tiny_core(variant):
    core = {
        "vocab_size": 512,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "qk_rope_head_dim": 16,
        "q_lora_rank": 32,
        "o_groups": 2,
        "o_lora_rank": 16,
        "moe_intermediate_size": 96,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 3,
        "hc_eps": 1e-6,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 128,
        "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus",
        "swiglu_limit": 0.0,
        "num_hash_layers": 0,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
    }
    if variant:
        core.update({"num_hash_layers": 1, "swiglu_limit": 0.5,
                     "hc_sinkhorn_iters": 1, "num_hidden_layers": 3})
    return core


def debug_core():
    """The debug preset (spec 1.3); used only for the self-test checkpoint."""
    core = tiny_core(False)
    core.update({"vocab_size": 129280, "moe_intermediate_size": 128,
                 "hc_sinkhorn_iters": 5, "max_position_embeddings": 512})
    return core


# ----------------------------------------------------------------- weights

@torch.no_grad()
def init_nontrivial(model, gen):
    """Random weights that break every symmetry of the spec init, so that a
    transposed comb, a swapped stream, a wrong sign etc. change the outputs.
    The HC parameters are large on purpose: with the spec's scale the streams
    stay nearly equal and comb nearly uniform, and a transposed comb or a wrong
    Sinkhorn count would move the logits by only ~1e-3 (check_reference.py)."""
    cfg = model.cfg

    def normal(p, std, mean=0.0):
        p.copy_(torch.randn(p.shape, generator=gen) * std + mean)

    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if name == "model.embed_tokens.weight":
            normal(p, 1.0)
        elif name == "lm_head.weight" or name.endswith("gate.weight"):
            normal(p, 1.0 / math.sqrt(cfg.hidden_size))
        elif name.endswith("gate.bias"):
            normal(p, 0.3)
        elif name.endswith("norm.weight"):
            normal(p, 0.1, 1.0)
        elif leaf in ("hc_attn_fn", "hc_ffn_fn", "hc_head_fn"):
            normal(p, 1.0 / math.sqrt(p.shape[1]))
        elif leaf in ("hc_attn_base", "hc_ffn_base", "hc_head_base"):
            normal(p, 1.0)
        elif leaf in ("hc_attn_scale", "hc_ffn_scale", "hc_head_scale"):
            p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
        elif leaf == "attn_sink":
            normal(p, 1.0)
        elif leaf == "weight" and p.dim() == 2:          # remaining Linear layers
            normal(p, 1.0 / math.sqrt(p.shape[1]))
        else:
            raise AssertionError(f"no init rule for {name}")
    return model


# ----------------------------------------------------------------- running

@torch.no_grad()
def run(model, input_ids, labels=None):
    rec = {}
    out = model(input_ids, labels=labels, record=rec)
    return out, rec


@torch.no_grad()
def greedy(model, prompt, n):
    """n tokens by argmax of the last position, full recompute each step.
    Returns (tokens, smallest top1-top2 logit gap seen)."""
    seq = prompt.clone().view(1, -1)
    toks, gap = [], float("inf")
    for _ in range(n):
        logits = model(seq, last_only=True)["logits"][0, -1]
        top2 = torch.topk(logits, 2).values
        gap = min(gap, float(top2[0] - top2[1]))
        t = int(torch.argmax(logits))
        toks.append(t)
        seq = torch.cat([seq, torch.tensor([[t]], dtype=seq.dtype)], dim=1)
    return toks, gap


def route_margins(model, input_ids):
    """Smallest top-K / top-(K+1) gap of the biased selection score, per layer."""
    margins = {}
    hooks = []
    K = model.cfg.num_experts_per_tok

    def make(l, gate):
        def hook(mod, inp, out):
            _, b = mod.scores(inp[0])
            v = torch.sort(b, dim=-1, descending=True).values
            margins[l] = float((v[:, K - 1] - v[:, K]).min()) if v.shape[1] > K else float("inf")
        return hook

    for l, layer in enumerate(model.model.layers):
        hooks.append(layer.ffn.gate.register_forward_hook(make(l, layer.ffn.gate)))
    with torch.no_grad():
        model(input_ids)
    for h in hooks:
        h.remove()
    return margins


def compare(name, a, b):
    a, b = a.double(), b.double()
    d = (a - b).abs().max().item()
    scale = b.abs().max().item()
    rel = d / scale if scale else 0.0
    return d, rel


def report_fp(rec32, rec64, out32, out64, keys):
    worst = 0.0
    lines = []
    for k in keys:
        d, rel = compare(k, rec32[k], rec64[k])
        worst = max(worst, rel)
        lines.append(f"    {k:32s} max|d|={d:.3e}  rel(max-norm)={rel:.3e}")
    d, rel = compare("logits", out32["logits"], out64["logits"])
    lines.append(f"    {'logits':32s} max|d|={d:.3e}  rel(max-norm)={rel:.3e}")
    worst = max(worst, rel)
    return worst, lines


def f32(t):
    return t.detach().to(torch.float64).numpy().astype(np.float32)


def i32(t):
    return np.asarray(t.detach().numpy() if hasattr(t, "detach") else t).astype(np.int32)


def intermediates(rec):
    out = {}
    for k, v in rec.items():
        out[k] = i32(v) if k.endswith("topk_idx") else f32(v)
    return out


def check_routing_equal(rec32, rec64):
    for k in rec64:
        if k.endswith("topk_idx") and not torch.equal(rec32[k], rec64[k]):
            raise SystemExit(f"routing differs between float32 and float64 at {k}; change the seed")


# ----------------------------------------------------------------- tiny mode

def mode_tiny(args):
    t0 = time.time()
    core = tiny_core(args.variant)
    cfgd = full_config(core)
    cfg = ref.Config(cfgd)
    seed = 20240 + (1 if args.variant else 0)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = ref.DeepseekV4ForCausalLM(cfg)
    init_nontrivial(model, gen)
    ref.save_model(model, args.model_dir, cfgd)

    # reload through the strict loader, so the golden comes from the files
    m32 = ref.load_model(args.model_dir, torch.float32)
    m64 = ref.load_model(args.model_dir, torch.float64)

    V = cfg.vocab_size
    input_ids = torch.randint(0, V, (2, 16), generator=gen)
    labels_masked = input_ids.clone()
    for b, s in [(0, 0), (0, 3), (0, 4), (0, 15), (1, 1), (1, 9)]:
        labels_masked[b, s] = -100
    prompt = torch.randint(0, V, (5,), generator=gen)

    res = common_outputs(m32, m64, input_ids, labels_masked, prompt, full_logits=True)
    g = res["golden"]
    g["input_ids"] = i32(input_ids)
    g["input_ids_masked"] = i32(labels_masked)
    st.save(args.golden, g, metadata={
        "generator": "tests/reference/gen_goldens.py tiny",
        "precision": "float64 reference rounded to F32",
        "seed": str(seed),
        "model_dir": os.path.basename(os.path.normpath(args.model_dir)),
    })
    print_summary(args, res, time.time() - t0)


def common_outputs(m32, m64, input_ids, labels_masked, prompt, full_logits):
    out64, rec64 = run(m64, input_ids, labels=input_ids)
    out32, rec32 = run(m32, input_ids, labels=input_ids)
    check_routing_equal(rec32, rec64)
    keys = sorted(k for k in rec64 if not k.endswith("topk_idx"))
    worst, lines = report_fp(rec32, rec64, out32, out64, keys)
    loss_d = abs(float(out32["loss"]) - float(out64["loss"]))

    res = {"lines": lines, "worst": worst, "loss64": float(out64["loss"]),
           "loss32": float(out32["loss"]), "loss_d": loss_d}
    g = {}
    g.update(intermediates(rec64))
    g["loss"] = np.array([float(out64["loss"])], dtype=np.float32)
    if full_logits:
        g["logits"] = f32(out64["logits"])
    if labels_masked is not None:
        lm64 = m64(input_ids, labels=labels_masked)["loss"]
        lm32 = m32(input_ids, labels=labels_masked)["loss"]
        g["loss_masked"] = np.array([float(lm64)], dtype=np.float32)
        res["loss_masked"] = (float(lm64), float(lm32))

    t = time.time()
    toks64, gap64 = greedy(m64, prompt, 32)
    res["greedy_s64"] = time.time() - t
    t = time.time()
    toks32, gap32 = greedy(m32, prompt, 32)
    res["greedy_s32"] = time.time() - t
    if toks32 != toks64:
        raise SystemExit(f"greedy tokens differ float32 {toks32} vs float64 {toks64}")
    g["greedy_prompt"] = i32(prompt)
    g["greedy_tokens"] = np.array(toks64, dtype=np.int32)
    res["greedy_gap"] = gap64
    res["route_margin"] = route_margins(m64, input_ids)
    res["golden"] = g
    res["out64"], res["out32"] = out64, out32
    return res


def print_summary(args, res, secs):
    print(f"wrote {args.golden}")
    print("float32 vs float64 (max abs diff, and relative to the float64 tensor's max |value|):")
    for line in res["lines"]:
        print(line)
    print(f"  worst relative: {res['worst']:.3e}")
    print(f"  loss float64 {res['loss64']:.9f} float32 {res['loss32']:.9f} |d|={res['loss_d']:.3e}")
    if "loss_masked" in res:
        print(f"  loss_masked float64 {res['loss_masked'][0]:.9f} float32 {res['loss_masked'][1]:.9f}")
    print(f"  routing identical; smallest top-K margin per layer: "
          + ", ".join(f"{l}:{m:.3e}" for l, m in sorted(res["route_margin"].items())))
    print(f"  greedy tokens identical; smallest top1-top2 logit gap {res['greedy_gap']:.3e}")
    print(f"  greedy time: float64 {res['greedy_s64']:.2f}s, float32 {res['greedy_s32']:.2f}s; total {secs:.1f}s")
    for k in sorted(res["golden"]):
        v = res["golden"][k]
        print(f"    {k:32s} {str(v.dtype):8s} {list(v.shape)}")


# ----------------------------------------------------------------- debug mode

def mode_debug(args):
    t0 = time.time()
    m32 = ref.load_model(args.model_dir, torch.float32)
    m64 = ref.load_model(args.model_dir, torch.float64)
    cfg = m32.cfg
    V = cfg.vocab_size
    gen = torch.Generator().manual_seed(31337)
    input_ids = torch.randint(0, V, (2, 12), generator=gen)
    prompt = torch.randint(0, V, (5,), generator=gen)
    cols = torch.randperm(V, generator=gen)[:2048]

    res = common_outputs(m32, m64, input_ids, None, prompt, full_logits=False)
    g = res["golden"]
    logits = res["out64"]["logits"]                       # [2,12,V] float64
    argmax = logits.argmax(-1)
    cols = torch.unique(torch.cat([cols, argmax.reshape(-1)]))   # sorted, distinct
    g["input_ids"] = i32(input_ids)
    g["logits_cols"] = i32(cols)
    g["logits_subset"] = f32(logits[:, :, cols])
    g["logsumexp"] = f32(torch.logsumexp(logits, dim=-1))
    g["argmax"] = i32(argmax)
    if not torch.equal(res["out32"]["logits"].argmax(-1), argmax):
        raise SystemExit("argmax differs between float32 and float64")

    tensors, _ = st.load(os.path.join(args.model_dir, "model.safetensors"))
    names = sorted(tensors)
    g["embed_sample"] = tensors["model.embed_tokens.weight"].reshape(-1)[:64].astype(np.float32)
    g["param_sums"] = np.array([tensors[n].astype(np.float64).sum() for n in names], dtype=np.float32)
    st.save(args.golden, g, metadata={
        "generator": "tests/reference/gen_goldens.py debug",
        "precision": "float64 reference rounded to F32",
        "param_names": ",".join(names),
    })
    d, rel = compare("lse", torch.logsumexp(res["out32"]["logits"], -1), torch.logsumexp(logits, -1))
    res["lines"].append(f"    {'logsumexp':32s} max|d|={d:.3e}  rel(max-norm)={rel:.3e}")
    print_summary(args, res, time.time() - t0)


def make_debug_checkpoint(out_dir, seed=1):
    """A debug-preset checkpoint with the spec initialisation (for testing
    `debug` mode before the C engine can write one)."""
    cfgd = full_config(debug_core())
    cfg = ref.Config(cfgd)
    model = ref.DeepseekV4ForCausalLM(cfg)
    ref.init_spec(model, torch.Generator().manual_seed(seed))
    ref.save_model(model, out_dir, cfgd)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("tiny")
    a.add_argument("model_dir")
    a.add_argument("golden")
    a.add_argument("--variant", action="store_true")
    b = sub.add_parser("debug")
    b.add_argument("model_dir")
    b.add_argument("golden")
    c = sub.add_parser("make-debug-checkpoint", help="spec-init debug checkpoint (self-test only)")
    c.add_argument("model_dir")
    c.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    if args.mode == "tiny":
        mode_tiny(args)
    elif args.mode == "debug":
        mode_debug(args)
    else:
        make_debug_checkpoint(args.model_dir, args.seed)


if __name__ == "__main__":
    main()
