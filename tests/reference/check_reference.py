#!/usr/bin/python3
"""Self-checks of the reference model (run by hand after changing it).

1. A second, deliberately naive implementation of the spec in numpy float64
   (explicit loops over tokens, heads, streams, rotation pairs) must agree with
   nanowhale_ref.py in float64 to ~1e-12 on a model directory.
2. Mutation check: plausible implementation mistakes (transposed comb, wrong
   Sinkhorn count, RoPE sign/layout, missing de-rotation, bias in the routing
   weights, clamping the shared expert, ...) are injected into the reference
   and each must move the logits far beyond the C tests' tolerance, i.e. the
   golden model is able to catch them.

  /usr/bin/python3 tests/reference/check_reference.py tests/data/tiny [tests/data/tiny-variant ...]
"""

import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402
import nanowhale_ref as ref  # noqa: E402


# ----------------------------------------------------------------- naive numpy implementation

def naive_forward(W, c, ids):
    """Logits [B,S,V] for int ids [B,S]; W maps tensor name -> float64 array."""
    D, H, Dh, R = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["qk_rope_head_dim"]
    G, Ro, M, K = c["o_groups"], c["o_lora_rank"], c["hc_mult"], c["num_experts_per_tok"]
    E, eps, heps = c["n_routed_experts"], c["rms_norm_eps"], c["hc_eps"]
    lim = c["swiglu_limit"]
    B, S = ids.shape
    P = Dh - R
    half = R // 2

    def rms(v):
        return 1.0 / math.sqrt(sum(float(t) * float(t) for t in v) / len(v) + eps)

    def norm(v, w):
        return w * (v * rms(v))

    def sigmoid(t):
        return 1.0 / (1.0 + math.exp(-t))

    def softplus(t):
        return t if t > 20 else math.log1p(math.exp(t))

    def silu(t):
        return t * sigmoid(t)

    inv = [1.0 / (c["rope_theta"] ** (2 * j / R)) for j in range(half)]

    def rot(v, pos, sign):
        # rotation by sign*(-angle) on dims P..Dh-1, half-split pairs (P+j, P+half+j)
        v = v.copy()
        for j in range(half):
            ang = pos * inv[j]
            cs, sn = math.cos(ang), sign * math.sin(ang)
            a, b = v[P + j], v[P + half + j]
            v[P + j] = a * cs + b * sn
            v[P + half + j] = -a * sn + b * cs
        return v

    def expert(pfx, x, limit):
        g = W[pfx + "w1.weight"] @ x
        u = W[pfx + "w3.weight"] @ x
        h = np.zeros_like(g)
        for i in range(len(g)):
            gi, ui = g[i], u[i]
            if limit > 0:
                ui = min(max(ui, -limit), limit)
                gi = min(gi, limit)
            h[i] = silu(gi) * ui
        return W[pfx + "w2.weight"] @ h

    def hc_weights(xs, fn, scale, base, sinkhorn):
        flat = np.concatenate(xs)
        r = rms(flat)
        mixes = [float(fn[k] @ flat) * r for k in range(fn.shape[0])]
        pre = [sigmoid(mixes[m] * scale[0] + base[m]) + heps for m in range(M)]
        if not sinkhorn:
            return pre, None, None
        post = [2 * sigmoid(mixes[M + m] * scale[1] + base[M + m]) for m in range(M)]
        C = [[mixes[2 * M + M * i + j] * scale[2] + base[2 * M + M * i + j] for j in range(M)] for i in range(M)]
        for i in range(M):
            mx = max(C[i])
            ex = [math.exp(t - mx) for t in C[i]]
            C[i] = [t / sum(ex) + heps for t in ex]

        def colnorm():
            for j in range(M):
                sj = sum(C[i][j] for i in range(M)) + heps
                for i in range(M):
                    C[i][j] /= sj

        def rownorm():
            for i in range(M):
                si = sum(C[i]) + heps
                C[i] = [t / si for t in C[i]]

        colnorm()
        for _ in range(c["hc_sinkhorn_iters"] - 1):
            rownorm()
            colnorm()
        return pre, post, C

    logits = np.zeros((B, S, c["vocab_size"]))
    for b in range(B):
        # X[s][m] = stream m of token s
        X = [[W["model.embed_tokens.weight"][ids[b, s]].copy() for _ in range(M)] for s in range(S)]
        for l in range(c["num_hidden_layers"]):
            p = f"model.layers.{l}."
            # --- attention sub-layer
            hc = [hc_weights(X[s], W[p + "hc_attn_fn"], W[p + "hc_attn_scale"], W[p + "hc_attn_base"], True)
                  for s in range(S)]
            ys = [norm(sum(hc[s][0][m] * X[s][m] for m in range(M)), W[p + "attn_norm.weight"]) for s in range(S)]
            q = []
            kv = []
            for s in range(S):
                qa = norm(W[p + "attn.wq_a.weight"] @ ys[s], W[p + "attn.q_norm.weight"])
                qb = W[p + "attn.wq_b.weight"] @ qa
                heads = []
                for h in range(H):
                    v = qb[h * Dh:(h + 1) * Dh]
                    v = v * rms(v)
                    heads.append(rot(v, s, +1))
                q.append(heads)
                k = norm(W[p + "attn.wkv.weight"] @ ys[s], W[p + "attn.kv_norm.weight"])
                kv.append(rot(k, s, +1))
            outs = []
            for s in range(S):
                ocat = []
                for h in range(H):
                    sc = [float(q[s][h] @ kv[t]) / math.sqrt(Dh) for t in range(s + 1)]
                    mx = max(sc)
                    e = [math.exp(v - mx) for v in sc]
                    z = sum(e)
                    o = sum((e[t] / z) * kv[t] for t in range(s + 1))
                    ocat.append(rot(o, s, -1))
                ocat = np.concatenate(ocat)
                gsz = H * Dh // G
                zvec = np.concatenate([W[p + "attn.wo_a.weight"][g * Ro:(g + 1) * Ro] @ ocat[g * gsz:(g + 1) * gsz]
                                       for g in range(G)])
                outs.append(W[p + "attn.wo_b.weight"] @ zvec)
            X = [[hc[s][1][i] * outs[s] + sum(hc[s][2][i][j] * X[s][j] for j in range(M)) for i in range(M)]
                 for s in range(S)]
            # --- MoE sub-layer
            hc = [hc_weights(X[s], W[p + "hc_ffn_fn"], W[p + "hc_ffn_scale"], W[p + "hc_ffn_base"], True)
                  for s in range(S)]
            outs = []
            for s in range(S):
                x = norm(sum(hc[s][0][m] * X[s][m] for m in range(M)), W[p + "ffn_norm.weight"])
                lg = W[p + "ffn.gate.weight"] @ x
                sc = [math.sqrt(softplus(t)) for t in lg]
                bias = W.get(p + "ffn.gate.bias")
                sel = [sc[e] + (bias[e] if bias is not None else 0.0) for e in range(E)]
                order = sorted(range(E), key=lambda e: -sel[e])[:K]
                tot = sum(sc[e] for e in order) + 1e-20
                wts = {e: sc[e] / tot * c["routed_scaling_factor"] for e in order}
                y = np.zeros(D)
                for e in sorted(order):
                    y = y + wts[e] * expert(p + f"ffn.experts.{e}.", x, lim)
                y = y + expert(p + "ffn.shared_expert.", x, 0.0)
                outs.append(y)
            X = [[hc[s][1][i] * outs[s] + sum(hc[s][2][i][j] * X[s][j] for j in range(M)) for i in range(M)]
                 for s in range(S)]
        for s in range(S):
            pre, _, _ = hc_weights(X[s], W["model.hc_head_fn"], W["model.hc_head_scale"], W["model.hc_head_base"],
                                   False)
            h = norm(sum(pre[m] * X[s][m] for m in range(M)), W["model.norm.weight"])
            logits[b, s] = W["lm_head.weight"] @ h
    return logits


# ----------------------------------------------------------------- mutations

def mutations(cfg):
    """name -> context manager factory patching the reference module."""
    import contextlib

    def patch(obj, attr, new):
        @contextlib.contextmanager
        def cm():
            old = getattr(obj, attr)
            setattr(obj, attr, new(old))
            try:
                yield
            finally:
                setattr(obj, attr, old)
        return cm

    def hc_post_T(old):
        return lambda o, X, post, comb: old(o, X, post, comb.transpose(-1, -2))

    def sinkhorn_delta(d):
        def new(old):
            def f(X, fn, scale, base, c):
                c2 = ref.Config(dict(c.raw, hc_sinkhorn_iters=c.hc_sinkhorn_iters + d))
                return old(X, fn, scale, base, c2)
            return f
        return new

    def rope_plus_angle(old):
        # rotate by +angle everywhere (forward and de-rotation flip together)
        return lambda x, cos, sin: old(x, cos, -sin)

    def rope_interleaved(old):
        def f(x, cos, sin):
            a, b = x[..., 0::2], x[..., 1::2]
            out = torch.stack([a * cos + b * sin, a * (-sin) + b * cos], dim=-1)
            return out.flatten(-2)
        return f

    def no_derotate(old):
        state = {"n": 0}

        def f(x, cos, sin, R):
            state["n"] += 1
            if state["n"] % 3 == 0:      # third call per layer = output de-rotation
                return x
            return old(x, cos, sin, R)
        return f

    def rope_first_dims(old):
        def f(x, cos, sin, R):
            return torch.cat([ref.rotate_half_split(x[..., :R], cos, sin), x[..., R:]], dim=-1)
        return f

    def gate_bias_in_weights(old):
        def f(self, x):
            s, b = self.scores(x)
            idx = torch.topk(b, self.cfg.num_experts_per_tok, dim=-1).indices
            w = b.gather(1, idx)
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
            return idx, w * self.cfg.routed_scaling_factor
        return f

    def gate_no_bias_select(old):
        def f(self, x):
            s, b = self.scores(x)
            idx = torch.topk(s, self.cfg.num_experts_per_tok, dim=-1).indices
            w = s.gather(1, idx)
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
            return idx, w * self.cfg.routed_scaling_factor
        return f

    def gate_no_sqrt(old):
        def f(self, x):
            s = F.softplus(x @ self.weight.t())
            b = s + self.bias if self.bias is not None else s
            return s, b
        return f

    def post_no_2(old):
        def f(X, fn, scale, base, c):
            y, pre, post, comb = old(X, fn, scale, base, c)
            return y, pre, post / 2, comb
        return f

    def comb_col_softmax(old):
        def f(X, fn, scale, base, c):
            y, pre, post, comb = old(X, fn, scale, base, c)
            return y, pre, post, comb.transpose(-1, -2)   # same as softmax/normalise on the other axis
        return f

    def clamp_shared(old):
        def f(self, y, record=None, prefix=""):
            saved = self.shared_expert.limit
            self.shared_expert.limit = self.experts[0].limit
            try:
                return old(self, y, record, prefix)
            finally:
                self.shared_expert.limit = saved
        return f

    def no_clamp(old):
        def f(self, x):
            saved = self.limit
            self.limit = 0.0
            try:
                return old(self, x)
            finally:
                self.limit = saved
        return f

    def expert_rank_order(old):
        # accumulate routed experts in top-k rank order instead of expert index order
        def f(self, y, record=None, prefix=""):
            B, S, D = y.shape
            x = y.reshape(B * S, D)
            idx, w = self.gate(x)
            out = torch.zeros_like(x)
            for k in range(idx.shape[1]):
                for n in range(x.shape[0]):
                    out[n] = out[n] + w[n, k] * self.experts[int(idx[n, k])](x[n:n + 1])[0]
            return (out + self.shared_expert(x)).view(B, S, D)
        return f

    def pre_sum_no_weights(old):
        def f(X, fn, scale, base, c):
            y, pre, post, comb = old(X, fn, scale, base, c)
            return X.mean(-2) * 2, pre, post, comb
        return f

    def swap_wo_a_groups(old):
        def f(self, y, cos, sin):
            w = self.wo_a.weight.data.clone()
            G, Ro = self.G, self.Ro
            self.wo_a.weight.data.copy_(w.view(Ro, G, -1).transpose(0, 1).reshape_as(w))
            try:
                return old(self, y, cos, sin)
            finally:
                self.wo_a.weight.data.copy_(w)
        return f

    m = {
        "hc_post contracts comb's first index": patch(ref, "hc_post", hc_post_T),
        "sinkhorn iters - 1": patch(ref, "hc_pre", sinkhorn_delta(-1)) if cfg.hc_sinkhorn_iters > 1 else None,
        "sinkhorn iters + 1": patch(ref, "hc_pre", sinkhorn_delta(+1)),
        "comb normalised on the other axis": patch(ref, "hc_pre", comb_col_softmax),
        "post without factor 2": patch(ref, "hc_pre", post_no_2),
        "hc_pre plain stream sum": patch(ref, "hc_pre", pre_sum_no_weights),
        "rope rotates by +angle": patch(ref, "rotate_half_split", rope_plus_angle),
        "rope interleaved pairs": patch(ref, "rotate_half_split", rope_interleaved),
        "rope on the first R dims": patch(ref, "apply_rope_tail", rope_first_dims),
        "no output de-rotation": patch(ref, "apply_rope_tail", no_derotate),
        "wo_a group rows interleaved": patch(ref.Attention, "forward", swap_wo_a_groups),
        "gate bias in routing weights": patch(ref.Gate, "forward", gate_bias_in_weights),
        "gate ignores bias for selection": patch(ref.Gate, "forward", gate_no_bias_select),
        "gate softplus without sqrt": patch(ref.Gate, "scores", gate_no_sqrt),
    }
    # Informational: with K=2 the order is immaterial (0+a+b == 0+b+a exactly);
    # it would matter only for K >= 3.
    m["experts in top-k rank order (expected identical for K=2)"] = patch(ref.MoE, "forward", expert_rank_order)
    if cfg.swiglu_limit > 0:
        m["shared expert clamped too"] = patch(ref.MoE, "forward", clamp_shared)
        m["no swiglu clamp"] = patch(ref.Expert, "forward", no_clamp)
    return {k: v for k, v in m.items() if v is not None}


def main():
    torch.set_num_threads(2)
    for model_dir in sys.argv[1:] or ["tests/data/tiny"]:
        print(f"== {model_dir}")
        model = ref.load_model(model_dir, torch.float64)
        cfg = model.cfg
        tensors, _ = st.load(os.path.join(model_dir, "model.safetensors"))
        W = {k: v.astype(np.float64) for k, v in tensors.items()}
        gen = torch.Generator().manual_seed(7)
        ids = torch.randint(0, cfg.vocab_size, (2, 10), generator=gen)
        with torch.no_grad():
            lt = model(ids)["logits"].numpy()
        ln = naive_forward(W, cfg.raw, ids.numpy())
        d = np.abs(lt - ln).max()
        print(f"naive numpy vs reference (float64): max|d| = {d:.3e} (max|logit| {np.abs(ln).max():.3f})")
        assert d < 1e-9, "reference disagrees with the naive implementation"

        for name, cm in mutations(cfg).items():
            with cm(), torch.no_grad():
                lm = model(ids)["logits"].numpy()
            rel = np.abs(lm - lt).max() / np.abs(lt).max()
            flag = "ok" if rel > 1e-3 else ("identical, as expected" if "expected identical" in name
                                             else "NOT DETECTED")
            print(f"  mutation {name:56s} rel change {rel:.2e}  {flag}")


if __name__ == "__main__":
    main()
