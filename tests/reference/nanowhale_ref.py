"""Independent PyTorch reference of the nanowhale forward pass.

Written from the project specification (spec/nanowhale.md, sections 1-3 and
5); each module below follows one subsection of section 3.  It is meant to be
read next to the spec, not to be fast.  CPU only; works in float32 (the
reference precision) and float64 (for measuring float32 rounding error).

Usage:
    model = load_model("tests/data/tiny")          # config.json + model.safetensors
    rec = {}
    out = model(input_ids, labels=input_ids, record=rec)
    out["logits"], out["loss"], rec["layers.0.hc_attn.comb"], ...

Intermediates recorded into `record` (N = B*S tokens in row-major (b, s)):
    layers.{l}.hc_attn.pre   [N, M]     HC_pre stream weights (incl. +hc_eps)
    layers.{l}.hc_attn.post  [N, M]     HC_post output weights
    layers.{l}.hc_attn.comb  [N, M, M]  mixing matrix after the full Sinkhorn
    layers.{l}.hc_ffn.{pre,post,comb}   same for the FFN sub-layer
    layers.{l}.ffn.topk_idx    [N, K]   int64, descending biased score
    layers.{l}.ffn.topk_weight [N, K]   final routing weights, same order
    final_hidden             [N, D]     output of the final RMSNorm
"""

import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402


# ----------------------------------------------------------------- config

class Config:
    """The config.json fields the forward pass uses (others are ignored)."""

    USED = [
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "head_dim", "qk_rope_head_dim", "q_lora_rank", "o_groups", "o_lora_rank",
        "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok",
        "scoring_func", "routed_scaling_factor", "num_hash_layers", "swiglu_limit",
        "hc_mult", "hc_sinkhorn_iters", "hc_eps", "rms_norm_eps", "rope_theta",
        "max_position_embeddings",
    ]
    OPTIONAL = {"initializer_range": 0.02, "tie_word_embeddings": False}   # init / tying only

    def __init__(self, d):
        d = dict(self.OPTIONAL, **d)
        missing = [k for k in self.USED if k not in d]
        if missing:
            raise ValueError(f"config is missing fields: {missing}")
        for k in self.USED + list(self.OPTIONAL):
            setattr(self, k, d[k])
        self.raw = dict(d)
        if self.tie_word_embeddings:
            raise ValueError("tie_word_embeddings=true is not a nanowhale checkpoint")
        if self.scoring_func not in ("sqrtsoftplus", "softmax", "sigmoid"):
            raise ValueError(f"unknown scoring_func {self.scoring_func}")
        if self.head_dim <= self.qk_rope_head_dim or self.qk_rope_head_dim % 2:
            raise ValueError("bad head_dim / qk_rope_head_dim")
        if (self.num_attention_heads * self.head_dim) % self.o_groups:
            raise ValueError("H*head_dim must be divisible by o_groups")
        if self.hc_sinkhorn_iters < 1:
            raise ValueError("hc_sinkhorn_iters must be >= 1")

    @classmethod
    def from_file(cls, path):
        with open(path) as f:
            return cls(json.load(f))


# ----------------------------------------------------------------- 3.1 RMSNorm

def rms_scale(x, eps):
    """1/sqrt(mean(x^2) + eps) over the last dim (keepdim)."""
    return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        # (x * r) first, then * weight
        return self.weight * (x * rms_scale(x, self.eps))


# ----------------------------------------------------------------- 3.3 RoPE

def rope_table(cfg, dtype):
    """cos, sin [max_pos, R/2]; computed in `dtype` (float32 is the spec's)."""
    R = cfg.qk_rope_head_dim
    expo = torch.arange(0, R, 2, dtype=dtype) / R           # (2j)/R
    inv = 1.0 / (float(cfg.rope_theta) ** expo)              # theta^(2j/R), reciprocal
    pos = torch.arange(cfg.max_position_embeddings, dtype=dtype)
    ang = torch.outer(pos, inv)
    return torch.cos(ang), torch.sin(ang)


def rotate_half_split(x, cos, sin):
    """Half-split rotation of the last dim of x (size R):
        a' = a*c + b*s ;  b' = a*(-s) + b*c      (rotation by -angle)
    cos, sin broadcast against x[..., :R/2]."""
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat([a * cos + b * sin, a * (-sin) + b * cos], dim=-1)


def apply_rope_tail(x, cos, sin, R):
    """RoPE on the last R dims of x; the first dims (nope) unchanged."""
    nope, rope = x[..., :-R], x[..., -R:]
    return torch.cat([nope, rotate_half_split(rope, cos, sin)], dim=-1)


# ----------------------------------------------------------------- 3.7 attention

class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        D, H, Dh = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
        G, Ro, Q = cfg.o_groups, cfg.o_lora_rank, cfg.q_lora_rank
        self.cfg = cfg
        self.H, self.Dh, self.R, self.G, self.Ro = H, Dh, cfg.qk_rope_head_dim, G, Ro
        self.eps = cfg.rms_norm_eps
        self.attn_sink = nn.Parameter(torch.zeros(H))       # present, unused
        self.wq_a = nn.Linear(D, Q, bias=False)
        self.q_norm = RMSNorm(Q, cfg.rms_norm_eps)
        self.wq_b = nn.Linear(Q, H * Dh, bias=False)
        self.wkv = nn.Linear(D, Dh, bias=False)
        self.kv_norm = RMSNorm(Dh, cfg.rms_norm_eps)
        self.wo_a = nn.Linear(H * Dh // G, G * Ro, bias=False)
        self.wo_b = nn.Linear(G * Ro, D, bias=False)

    def forward(self, y, cos, sin):
        B, S, _ = y.shape
        H, Dh, R, G, Ro = self.H, self.Dh, self.R, self.G, self.Ro
        # 1-3: low-rank q, per-head weightless RMS norm
        q = self.wq_b(self.q_norm(self.wq_a(y)))
        q = q.view(B, S, H, Dh).transpose(1, 2)                # [B,H,S,Dh]
        q = q * rms_scale(q, self.eps)
        # 4: single shared K=V head
        kv = self.kv_norm(self.wkv(y)).unsqueeze(1)            # [B,1,S,Dh]
        # 5: RoPE on the last R dims, rotation by -angle at each token's position
        q = apply_rope_tail(q, cos, sin, R)
        kv = apply_rope_tail(kv, cos, sin, R)
        # 6: math attention: q and k both scaled by sqrt(Dh^-1/2), additive causal mask
        sq = math.sqrt(1.0 / math.sqrt(Dh))
        scores = (q * sq) @ (kv * sq).transpose(-2, -1)        # [B,H,S,S]
        mask = torch.full((S, S), float("-inf"), dtype=y.dtype).triu(1)
        p = torch.softmax(scores + mask, dim=-1)
        o = p @ kv                                             # [B,H,S,Dh]
        # 7: de-rotate the rope dims at the query position (inverse rotation)
        o = apply_rope_tail(o, cos, -sin, R)
        # 8: grouped (block-diagonal) wo_a, then wo_b
        o = o.transpose(1, 2).reshape(B, S, G, H * Dh // G)
        wa = self.wo_a.weight.view(G, Ro, H * Dh // G)
        z = torch.einsum("bsgd,grd->bsgr", o, wa).reshape(B, S, G * Ro)
        return self.wo_b(z)


# ----------------------------------------------------------------- 3.8 MoE

class Expert(nn.Module):
    def __init__(self, D, Fi, limit):
        super().__init__()
        self.limit = limit
        self.w1 = nn.Linear(D, Fi, bias=False)
        self.w2 = nn.Linear(Fi, D, bias=False)
        self.w3 = nn.Linear(D, Fi, bias=False)

    def forward(self, x):
        g = self.w1(x)
        u = self.w3(x)
        if self.limit > 0:
            u = torch.clamp(u, min=-self.limit, max=self.limit)
            g = torch.clamp(g, max=self.limit)
        return self.w2(F.silu(g) * u)


class Gate(nn.Module):
    def __init__(self, cfg, has_bias):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.zeros(cfg.n_routed_experts, cfg.hidden_size))
        if has_bias:
            self.bias = nn.Parameter(torch.zeros(cfg.n_routed_experts))
        else:
            self.register_parameter("bias", None)

    def scores(self, x):
        """x [N,D] -> (s, b): routing scores and biased selection scores [N,E]."""
        cfg = self.cfg
        logits = x @ self.weight.t()
        if cfg.scoring_func == "sqrtsoftplus":
            s = torch.sqrt(F.softplus(logits))     # beta 1, threshold 20
        elif cfg.scoring_func == "sigmoid":
            s = torch.sigmoid(logits)
        else:
            s = torch.softmax(logits, dim=-1)
        b = s + self.bias if self.bias is not None else s
        return s, b

    def forward(self, x):
        """x [N,D] -> (idx [N,K] int64, weight [N,K])."""
        cfg = self.cfg
        s, b = self.scores(x)
        idx = torch.topk(b, cfg.num_experts_per_tok, dim=-1, largest=True, sorted=True).indices
        w = s.gather(1, idx)
        if cfg.scoring_func != "softmax":
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        w = w * cfg.routed_scaling_factor
        return idx, w


class MoE(nn.Module):
    def __init__(self, cfg, layer_id):
        super().__init__()
        D, Fi = cfg.hidden_size, cfg.moe_intermediate_size
        self.gate = Gate(cfg, has_bias=layer_id >= cfg.num_hash_layers)
        self.experts = nn.ModuleList(
            [Expert(D, Fi, cfg.swiglu_limit) for _ in range(cfg.n_routed_experts)])
        self.shared_expert = Expert(D, Fi, 0.0)              # never clamps

    def forward(self, y, record=None, prefix=""):
        B, S, D = y.shape
        x = y.reshape(B * S, D)
        idx, w = self.gate(x)
        if record is not None:
            record[prefix + "topk_idx"] = idx.detach().clone()
            record[prefix + "topk_weight"] = w.detach().clone()
        out = torch.zeros_like(x)
        # ascending expert index; weight multiplies the expert output (after w2)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.nonzero(idx == e, as_tuple=True)
            if tok.numel() == 0:
                continue
            out[tok] = out[tok] + w[tok, slot].unsqueeze(-1) * expert(x[tok])
        out = out + self.shared_expert(x)
        return out.view(B, S, D)


# ----------------------------------------------------------------- 3.5 / 3.6 hyper-connections

def hc_pre(X, fn, scale, base, cfg):
    """X [B,S,M,D] -> y [B,S,D], pre [B,S,M], post [B,S,M], comb [B,S,M,M]."""
    B, S, M, D = X.shape
    eps, hc_eps = cfg.rms_norm_eps, cfg.hc_eps
    xf = X.reshape(B, S, M * D)                                 # stream-major
    mixes = (xf @ fn.t()) * rms_scale(xf, eps)                  # [B,S,(2+M)M]
    pre = torch.sigmoid(mixes[..., :M] * scale[0] + base[:M]) + hc_eps
    post = 2 * torch.sigmoid(mixes[..., M:2 * M] * scale[1] + base[M:2 * M])
    comb = (mixes[..., 2 * M:].reshape(B, S, M, M) * scale[2]
            + base[2 * M:].reshape(M, M))
    comb = torch.softmax(comb, dim=-1) + hc_eps                  # rows, then +eps
    comb = comb / (comb.sum(-2, keepdim=True) + hc_eps)          # column normalise
    for _ in range(cfg.hc_sinkhorn_iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + hc_eps)      # row normalise
        comb = comb / (comb.sum(-2, keepdim=True) + hc_eps)      # column normalise
    y = (pre.unsqueeze(-1) * X).sum(-2)
    return y, pre, post, comb


def hc_post(o, X, post, comb):
    """X'_i = post_i * o + sum_j comb[i][j] * X_j  (contracts comb's SECOND index)."""
    return post.unsqueeze(-1) * o.unsqueeze(-2) + torch.einsum("bsij,bsjd->bsid", comb, X)


class Block(nn.Module):
    def __init__(self, cfg, layer_id):
        super().__init__()
        M, D = cfg.hc_mult, cfg.hidden_size
        mix = (2 + M) * M
        self.cfg = cfg
        self.layer_id = layer_id
        self.hc_attn_fn = nn.Parameter(torch.zeros(mix, M * D))
        self.hc_ffn_fn = nn.Parameter(torch.zeros(mix, M * D))
        self.hc_attn_base = nn.Parameter(torch.zeros(mix))
        self.hc_ffn_base = nn.Parameter(torch.zeros(mix))
        self.hc_attn_scale = nn.Parameter(torch.ones(3))
        self.hc_ffn_scale = nn.Parameter(torch.ones(3))
        self.attn = Attention(cfg)
        self.ffn = MoE(cfg, layer_id)
        self.attn_norm = RMSNorm(D, cfg.rms_norm_eps)
        self.ffn_norm = RMSNorm(D, cfg.rms_norm_eps)

    def forward(self, X, cos, sin, record=None):
        B, S, M, _ = X.shape
        p = f"layers.{self.layer_id}."
        y, pre, post, comb = hc_pre(X, self.hc_attn_fn, self.hc_attn_scale, self.hc_attn_base, self.cfg)
        if record is not None:
            record[p + "hc_attn.pre"] = pre.reshape(B * S, M).detach().clone()
            record[p + "hc_attn.post"] = post.reshape(B * S, M).detach().clone()
            record[p + "hc_attn.comb"] = comb.reshape(B * S, M, M).detach().clone()
        X = hc_post(self.attn(self.attn_norm(y), cos, sin), X, post, comb)
        y, pre, post, comb = hc_pre(X, self.hc_ffn_fn, self.hc_ffn_scale, self.hc_ffn_base, self.cfg)
        if record is not None:
            record[p + "hc_ffn.pre"] = pre.reshape(B * S, M).detach().clone()
            record[p + "hc_ffn.post"] = post.reshape(B * S, M).detach().clone()
            record[p + "hc_ffn.comb"] = comb.reshape(B * S, M, M).detach().clone()
        X = hc_post(self.ffn(self.ffn_norm(y), record, p + "ffn."), X, post, comb)
        return X


# ----------------------------------------------------------------- model

class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        M, D = cfg.hc_mult, cfg.hidden_size
        self.cfg = cfg
        self.hc_head_fn = nn.Parameter(torch.zeros(M, M * D))
        self.hc_head_base = nn.Parameter(torch.zeros(M))
        self.hc_head_scale = nn.Parameter(torch.ones(1))
        self.embed_tokens = nn.Embedding(cfg.vocab_size, D)
        self.layers = nn.ModuleList([Block(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(D, cfg.rms_norm_eps)

    def forward(self, input_ids, record=None):
        cfg = self.cfg
        B, S = input_ids.shape
        if S > cfg.max_position_embeddings:
            raise ValueError(f"sequence length {S} exceeds max_position_embeddings")
        dtype = self.embed_tokens.weight.dtype
        cos, sin = rope_table(cfg, dtype)
        cos, sin = cos[:S], sin[:S]                                # positions 0..S-1
        h0 = self.embed_tokens(input_ids)
        X = h0.unsqueeze(2).expand(B, S, cfg.hc_mult, cfg.hidden_size).contiguous()
        for layer in self.layers:
            X = layer(X, cos, sin, record)
        # 3.9 HC head: sigmoid reduction, no Sinkhorn
        M, D = cfg.hc_mult, cfg.hidden_size
        xf = X.reshape(B, S, M * D)
        mixes = (xf @ self.hc_head_fn.t()) * rms_scale(xf, cfg.rms_norm_eps)
        pre = torch.sigmoid(mixes * self.hc_head_scale[0] + self.hc_head_base) + cfg.hc_eps
        h = (pre.unsqueeze(-1) * X).sum(-2)
        h = self.norm(h)
        if record is not None:
            record["final_hidden"] = h.reshape(B * S, D).detach().clone()
        return h


class DeepseekV4ForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids, labels=None, record=None, last_only=False):
        """Returns {"logits": [B,S,V] (or [B,1,V] if last_only), "loss": scalar or None}.

        labels: [B,S] int, -100 = ignored; loss = mean CE of logits[:, :-1]
        against labels[:, 1:] (3.10)."""
        h = self.model(input_ids, record)
        if last_only:
            h = h[:, -1:]
        logits = self.lm_head(h)
        loss = None
        if labels is not None:
            if last_only:
                raise ValueError("loss needs all positions")
            V = logits.shape[-1]
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1),
                                   ignore_index=-100, reduction="mean")
        return {"logits": logits, "loss": loss}


# ----------------------------------------------------------------- loading / init

def expected_shapes(cfg):
    """name -> shape for every tensor of a checkpoint with this config (2.2)."""
    return {k: tuple(v.shape) for k, v in DeepseekV4ForCausalLM(cfg).state_dict().items()}


def load_model(model_dir, dtype=torch.float32):
    """Build from config.json and load model.safetensors with strict name/shape checks."""
    cfg = Config.from_file(os.path.join(model_dir, "config.json"))
    model = DeepseekV4ForCausalLM(cfg)
    tensors, _ = st.load(os.path.join(model_dir, "model.safetensors"))
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing or extra:
        raise ValueError(f"checkpoint names differ: missing {missing[:10]} extra {extra[:10]}")
    bad = [(k, got[k], want[k]) for k in want if got[k] != want[k]]
    if bad:
        raise ValueError(f"checkpoint shapes differ: {bad[:10]}")
    sd = {k: torch.from_numpy(v.astype("float32")) for k, v in tensors.items()}
    model.load_state_dict(sd, strict=True)
    model.to(dtype)
    model.eval()
    return model


@torch.no_grad()
def init_spec(model, generator=None):
    """Initialisation of spec section 5 (training from scratch)."""
    std = model.cfg.initializer_range
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif leaf in ("hc_attn_fn", "hc_ffn_fn", "hc_head_fn"):
            p.normal_(0.0, 0.01, generator=generator)
        elif leaf in ("hc_attn_base", "hc_ffn_base", "hc_head_base", "attn_sink") or name.endswith("gate.bias"):
            p.zero_()
        elif leaf in ("hc_attn_scale", "hc_ffn_scale", "hc_head_scale"):
            p.fill_(1.0)
        elif leaf == "weight":      # every Linear, embed_tokens, gate.weight
            p.normal_(0.0, std, generator=generator)
        else:
            raise AssertionError(f"no init rule for {name}")
    return model


def save_model(model, model_dir, config_dict):
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config_dict, f, indent=2)
        f.write("\n")
    sd = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    st.save(os.path.join(model_dir, "model.safetensors"), sd)
