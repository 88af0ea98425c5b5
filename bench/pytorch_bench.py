#!/usr/bin/python3
"""CPU speed of the PyTorch reference model, for comparison with the C engine.

Run it as

    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/pytorch_bench.py [--threads 2]

OMP_WAIT_POLICY=PASSIVE is required: Debian's python3-torch uses GNU OpenMP,
whose idle worker threads otherwise spin and steal the CPU from everything
else (including the other threads of the same benchmark when cores are few).

BLAS: Debian's torch does its matrix products through libblas.so.3, which
is the unoptimised reference BLAS (~1 GFLOP/s here) unless an optimised one
is installed.  For a meaningful comparison use OpenBLAS, either system-wide
(`apt-get install libopenblas0-pthread`, which takes over the libblas.so.3
alternative) or for this command only:

    apt-get download libopenblas0-pthread && dpkg -x libopenblas0-pthread_*.deb /tmp/obl
    LD_LIBRARY_PATH=/tmp/obl/usr/lib/x86_64-linux-gnu/openblas-pthread \
        OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/pytorch_bench.py

The BLAS library actually loaded is reported in each JSON line ("blas").
OPENBLAS_NUM_THREADS defaults to --threads.

The model is the reference implementation in tests/reference/nanowhale_ref.py
(the same code that produces the golden files) with the 100m preset (spec
section 1.2) and the spec's random initialisation (section 5), float32,
inference under torch.no_grad().  Measurements, in the spirit of llama-bench:

  forward   batch 4 x seq 256, logits for every position (what training and
            loss evaluation compute)
  prefill   batch 1 x 512 tokens, logits for the last position only
  train     one forward + backward of 4 x 256 tokens (with --autocast bf16:
            under torch.autocast("cpu", dtype=torch.bfloat16), the mixed
            precision recipe the bf16 comparison uses)
  decode    generate --gen tokens greedily starting from a context of 128
            and of 1024 tokens; the model has no KV cache, so every token
            recomputes the whole sequence (last-position logits only)

Each measurement prints one JSON line:
  {"what", "batch", "seq_len", "context", "threads", "tokens_per_s", "seconds", "blas"}
seq_len is the number of tokens processed (forward/prefill) or generated
(decode), context the number of tokens already present before decoding
(0 for forward/prefill), seconds the wall time of one repetition (the
median over --reps repetitions after one warm-up; decode is timed once).
"""

import argparse
import json
import os
import statistics
import sys
import time

torch = ref = None      # imported in main(), after OPENBLAS_NUM_THREADS is set

CONFIG_100M = {
    "vocab_size": 129280, "hidden_size": 320, "num_hidden_layers": 8,
    "num_attention_heads": 8, "num_key_value_heads": 1, "moe_intermediate_size": 640,
    "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "q_lora_rank": 160, "head_dim": 96, "qk_rope_head_dim": 32, "o_groups": 2,
    "o_lora_rank": 80, "hc_mult": 4, "hc_sinkhorn_iters": 2, "hc_eps": 1e-6,
    "num_hash_layers": 0, "swiglu_limit": 0.0, "scoring_func": "sqrtsoftplus",
    "routed_scaling_factor": 1.5, "topk_method": "noaux_tc", "norm_topk_prob": True,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "initializer_range": 0.02, "tie_word_embeddings": False,
}


def blas_library():
    """Which BLAS is mapped into this process, as "<dir>/<file>" of the real
    file, e.g. "blas/libblas.so.3" (Debian's reference BLAS) or
    "openblas-pthread/libopenblasp-r0.3.21.so"."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return "unknown"
    real = {os.path.realpath(p) for p in paths}
    hits = sorted(p for p in real if "blas" in os.path.basename(p).lower())
    return ",".join(os.path.join(os.path.basename(os.path.dirname(p)), os.path.basename(p))
                    for p in hits) or "none found"


def emit(what, batch, seq_len, context, threads, seconds):
    print(json.dumps({
        "what": what, "batch": batch, "seq_len": seq_len, "context": context,
        "threads": threads, "tokens_per_s": round(batch * seq_len / seconds, 3),
        "seconds": round(seconds, 4), "blas": blas_library(),
    }), flush=True)


def timed(fn, reps):
    fn()                                   # warm-up
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3, help="repetitions for forward/prefill")
    ap.add_argument("--gen", type=int, default=4, help="tokens generated per decode measurement")
    ap.add_argument("--what", default="forward,prefill,decode,train")
    ap.add_argument("--contexts", default="128,1024", help="decode start contexts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--autocast", choices=["bf16"], default=None,
                    help="train: the step under torch.autocast('cpu', dtype=torch.bfloat16)")
    args = ap.parse_args()

    global torch, ref
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
    import torch as _torch
    torch = _torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
    import nanowhale_ref as _ref
    ref = _ref

    if os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        print("warning: run with OMP_WAIT_POLICY=PASSIVE (idle OpenMP threads spin otherwise)",
              file=sys.stderr)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = ref.Config(CONFIG_100M)
    model = ref.DeepseekV4ForCausalLM(cfg)
    ref.init_spec(model, torch.Generator().manual_seed(args.seed))
    model.float().eval()
    V = cfg.vocab_size
    gen = torch.Generator().manual_seed(args.seed + 1)
    whats = set(args.what.split(","))

    with torch.no_grad():
        if "forward" in whats:
            ids = torch.randint(0, V, (4, 256), generator=gen)
            s = timed(lambda: model(ids), args.reps)
            emit("forward", 4, 256, 0, args.threads, s)
        if "prefill" in whats:
            ids = torch.randint(0, V, (1, 512), generator=gen)
            s = timed(lambda: model(ids, last_only=True), args.reps)
            emit("prefill", 1, 512, 0, args.threads, s)
        if "decode" in whats:
            for ctx in (int(c) for c in args.contexts.split(",")):
                if ctx + args.gen > cfg.max_position_embeddings:
                    raise SystemExit(f"context {ctx} + {args.gen} exceeds max_position_embeddings")
                seq = torch.randint(0, V, (1, ctx), generator=gen)
                model(seq[:, :16], last_only=True)     # warm-up
                t = time.perf_counter()
                for _ in range(args.gen):
                    nxt = model(seq, last_only=True)["logits"][0, -1].argmax()
                    seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
                emit("decode", 1, args.gen, ctx, args.threads, time.perf_counter() - t)

    if "train" in whats:
        # one training step: forward with the mean shifted loss, backward
        # (gradients for every parameter), no optimiser update
        model.train()
        ids = torch.randint(0, V, (4, 256), generator=gen)

        def step():
            model.zero_grad(set_to_none=True)
            if args.autocast:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(ids, labels=ids)["loss"]
            else:
                loss = model(ids, labels=ids)["loss"]
            loss.backward()

        s = timed(step, args.reps)
        emit("train" + ("-autocast-bf16" if args.autocast else ""), 4, 256, 0, args.threads, s)


if __name__ == "__main__":
    main()
