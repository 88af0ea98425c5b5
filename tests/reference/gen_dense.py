#!/usr/bin/python3
"""Golden files for the dense decoder's Llama and Qwen3 variants and its RoPE
scaling (tests/test_dense.c), from the PyTorch reference dense_ref.py.

Run by hand (not in CI), with Debian's python3-torch:

  /usr/bin/python3 tests/reference/gen_dense.py tests/data

For each case below it writes tests/data/dense-<case>/ with config.json,
model.safetensors (F32, non-symmetric random weights as gen_qwen2.py makes
them) and golden.safetensors holding what gen_qwen2.py's goldens hold
(input_ids, labels, logits, loss, the traced intermediates, grad.<param>, the
packed row) plus

  greedy_prompt [5], greedy_tokens [16]   greedy continuation, the whole
                                          sequence recomputed each step

and tests/data/rope-scaling.json: inv_freq and the attention factor of every
RoPE type (transformers' modeling_rope_utils formulas) on real configs'
settings, in float64.

Every float golden is computed in float64 and rounded to F32; the float32
run is done alongside and its deviation printed.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402
import dense_ref as ref  # noqa: E402
import gen_qwen2 as gq  # noqa: E402

GREEDY_PROMPT, GREEDY_NEW = 5, 16


def base_config(model_type, D, I, L, H, Hkv, V, tied, max_pos, head_dim=None):
    arch = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[model_type]
    d = {"architectures": [arch], "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": [1, 2],
         "hidden_act": "silu", "hidden_size": D, "initializer_range": 0.02, "intermediate_size": I,
         "max_position_embeddings": max_pos, "model_type": model_type, "num_attention_heads": H,
         "num_hidden_layers": L, "num_key_value_heads": Hkv, "rms_norm_eps": 1e-6,
         "tie_word_embeddings": tied, "use_cache": True, "vocab_size": V}
    if head_dim:
        d["head_dim"] = head_dim
    return d


def case_configs():
    # Llama, untied, every bias on, Llama 3.1 rope scaling (all three bands:
    # wavelengths 6.3 < 16 kept, 32.7 blended, the rest divided by 8), transformers-4 form
    llama = base_config("llama", 64, 96, 2, 4, 2, 160, False, 64, 16)
    llama.update({"attention_bias": True, "mlp_bias": True, "pretraining_tp": 1, "rope_theta": 500000.0,
                  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                  "torch_dtype": "float32", "transformers_version": "4.45.0"})
    # Llama, tied (SmolLM2's layout), GQA 4:1, transformers-5 form with dynamic
    # scaling past a window of 8 positions (the batch runs to 12)
    tied = base_config("llama", 48, 80, 2, 4, 1, 128, True, 8)
    tied.update({"attention_bias": False, "mlp_bias": False, "dtype": "float32",
                 "layer_types": ["full_attention"] * 2,
                 "rope_parameters": {"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 4.0},
                 "transformers_version": "5.0.0"})
    # Qwen3: q/k norms, head_dim 16 × 4 heads ≠ hidden 48, tied, GQA 2:1,
    # transformers-5 form with YaRN (ramp over pairs 0..3, attention factor 1.139)
    qwen3 = base_config("qwen3", 48, 96, 2, 4, 2, 192, True, 256, 16)
    qwen3.update({"attention_bias": False, "max_window_layers": 2, "sliding_window": None,
                  "use_sliding_window": False, "dtype": "float32", "layer_types": ["full_attention"] * 2,
                  "rope_parameters": {"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0,
                                      "original_max_position_embeddings": 64},
                  "transformers_version": "5.0.0"})
    return {"llama": (llama, 7201), "llama-tied": (tied, 7202), "qwen3": (qwen3, 7203)}


def greedy(model, prompt, n):
    ids = prompt.clone()
    gaps = []
    with torch.no_grad():
        for _ in range(n):
            lg = model(ids)["logits"][0, -1]
            top = torch.topk(lg, 2).values
            gaps.append((top[0] - top[1]).item())
            ids = torch.cat([ids, lg.argmax().view(1, 1)], dim=1)
    return ids[0, prompt.shape[1]:], min(gaps)


def make_case(name, cfgd, seed, out_dir):
    gen = torch.Generator().manual_seed(seed)
    model = ref.ForCausalLM(ref.Config(cfgd))
    gq.init_nontrivial(model, gen)
    mdir = os.path.join(out_dir, f"dense-{name}")
    ref.save_model(model, mdir, cfgd)
    m64, m32 = ref.load_model(mdir, torch.float64), ref.load_model(mdir, torch.float32)
    V = cfgd["vocab_size"]
    ids = torch.randint(0, V, (gq.B, gq.S), generator=gen)
    labels = ids.clone()
    for b, s in gq.IGNORED:
        labels[b, s] = -100
    lg64, loss64, rec64, g64 = gq.run(m64, ids, labels)
    lg32, loss32, rec32, g32 = gq.run(m32, ids, labels)
    pids, ppos, pseg, plab = gq.packed_batch(V, gen)
    prec = {}
    with torch.no_grad():
        ploss = m64(pids, labels=plab, position_ids=ppos, segment_start=pseg, record=prec)["loss"]
    prompt = torch.randint(0, V, (1, GREEDY_PROMPT), generator=gen)
    toks64, gap = greedy(m64, prompt, GREEDY_NEW)
    toks32, _ = greedy(m32, prompt, GREEDY_NEW)
    assert torch.equal(toks64, toks32), "float32 and float64 greedy continuations differ"

    g = {"input_ids": gq.i32(ids), "labels": gq.i32(labels), "logits": gq.f32(lg64),
         "loss": np.array([loss64.item()], dtype=np.float32)}
    g.update({k: gq.f32(v) for k, v in rec64.items()})
    g.update({"grad." + n: gq.f32(v) for n, v in g64.items()})
    g.update({"packed.input_ids": gq.i32(pids), "packed.position_ids": gq.i32(ppos),
              "packed.segment_start": gq.i32(pseg), "packed.labels": gq.i32(plab),
              "packed.loss": np.array([ploss.item()], dtype=np.float32),
              "packed.final_hidden": gq.f32(prec["final_hidden"]),
              "greedy_prompt": gq.i32(prompt[0]), "greedy_tokens": gq.i32(toks64)})
    path = os.path.join(mdir, "golden.safetensors")
    st.save(path, g, metadata={"generator": "tests/reference/gen_dense.py", "case": name, "seed": str(seed),
                               "precision": "float64 reference rounded to F32"})
    worst_rec = max(gq.dev(rec32[k], rec64[k]) for k in rec64)
    worst_grad = max((gq.dev(g32[n], g64[n]), n) for n in g64)
    print(f"{path}: {sum(p.numel() for p in m64.parameters()):,} parameters, {os.path.getsize(path):,} bytes")
    print(f"  float32 vs float64: logits {gq.dev(lg32, lg64):.2e}, intermediates <= {worst_rec:.2e}, "
          f"loss |d| {abs(loss32.item() - loss64.item()):.2e}, gradients <= {worst_grad[0]:.2e} ({worst_grad[1]})")
    print(f"  loss {loss64.item():.6f}, packed loss {ploss.item():.6f}, max |logit| {lg64.abs().max().item():.3f}, "
          f"smallest greedy gap {gap:.3g}")


# RoPE settings of real configs (and variations) for the table check
ROPE_CASES = [
    ("default Qwen2.5", {"rope_theta": 1e6}, 128, 32768, None),
    ("linear", {"rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 4.0}}, 64, 2048, None),
    ("dynamic inside the window", {"rope_theta": 1e4, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
     64, 2048, 1000),
    ("dynamic past the window", {"rope_theta": 1e4, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
     64, 2048, 5000),
    ("dynamic, transformers 5", {"rope_parameters": {"rope_theta": 5e5, "rope_type": "dynamic", "factor": 4.0}},
     128, 8192, 20000),
    ("yarn Qwen2.5 long context", {"rope_theta": 1e6, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                                      "original_max_position_embeddings": 32768}},
     128, 32768, None),
    ("yarn mscale (DeepSeek style)", {"rope_parameters": {"rope_theta": 1e4, "rope_type": "yarn", "factor": 40.0,
                                                          "mscale": 1.0, "mscale_all_dim": 0.8,
                                                          "original_max_position_embeddings": 4096,
                                                          "beta_fast": 32, "beta_slow": 1}},
     64, 163840, None),
    ("yarn without truncation, explicit attention factor",
     {"rope_parameters": {"rope_theta": 1.5e5, "rope_type": "yarn", "factor": 32.0, "truncate": False,
                          "attention_factor": 1.25, "beta_fast": 16.0, "beta_slow": 2.0,
                          "original_max_position_embeddings": 4096}}, 64, 131072, None),
    ("yarn factor from the windows", {"rope_parameters": {"rope_theta": 1e4, "rope_type": "yarn",
                                                          "original_max_position_embeddings": 2048}},
     64, 8192, None),
    ("llama3 Llama 3.1", {"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                              "original_max_position_embeddings": 8192}},
     128, 131072, None),
    ("llama3 Llama 3.2", {"rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3", "factor": 32.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 8192}}, 64, 131072, None),
]


def rope_tables(out_dir):
    cases = []
    for name, fields, dim, max_pos, seq_len in ROPE_CASES:
        d = {"model_type": "llama", "vocab_size": 8, "hidden_size": dim, "intermediate_size": 8,
             "num_hidden_layers": 1, "num_attention_heads": 1, "max_position_embeddings": max_pos,
             "rms_norm_eps": 1e-6, **fields}
        inv, af = ref.rope_init(ref.Config(d), seq_len, torch.float64)
        cases.append({"name": name, "config": d, "seq_len": seq_len or max_pos,
                      "inv_freq": [float(x) for x in inv], "attention_factor": float(af)})
    path = os.path.join(out_dir, "rope-scaling.json")
    with open(path, "w") as f:
        json.dump({"generator": "tests/reference/gen_dense.py", "cases": cases}, f, indent=1)
        f.write("\n")
    print(f"{path}: {len(cases)} cases")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", help="tests/data")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    for name, (cfgd, seed) in case_configs().items():
        make_case(name, cfgd, seed, args.out_dir)
    rope_tables(args.out_dir)


if __name__ == "__main__":
    main()
