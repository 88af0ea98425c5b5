"""The dense decoder family -- Qwen2 (Qwen2ForCausalLM), Llama
(LlamaForCausalLM) and Qwen3 (Qwen3ForCausalLM) -- as plain PyTorch modules,
written from transformers' modeling_llama.py / modeling_qwen3.py and the RoPE
utilities of modeling_rope_utils.py (transformers is not used here).

    h = embed_tokens[ids]
    per layer:  h = h + o_proj(attention(input_layernorm(h)))
                h = h + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = post_attention_layernorm(h)
    logits = lm_head(norm(h))          (embed_tokens' matrix when tie_word_embeddings)

Variants (Config.model_type):
  qwen2  q/k/v Linear with bias, o_proj without;
  llama  q/k/v/o with bias iff attention_bias, gate/up/down with bias iff mlp_bias;
  qwen3  as llama for attention_bias (no mlp_bias), and q_norm / k_norm: RMSNorm
         over head_dim applied to every head of q and k before RoPE.

RoPE: rotate_half layout, cos/sin = cos(p * inv_freq), sin(p * inv_freq) times
the type's attention factor, with inv_freq and the factor from rope_init()
(default, linear, dynamic, yarn, llama3 -- the formulas of
modeling_rope_utils.py). The config may be transformers-4 (rope_theta +
rope_scaling) or transformers-5 (rope_parameters {rope_theta, rope_type, ...}).
Dynamic scaling uses seq_len = max(position_ids) + 1 of each forward, as
transformers' dynamic_rope_update does for a forward from scratch.

forward(ids, labels=None, position_ids=None, segment_start=None, record=None):
segment_start[b, s] is the first key position query s may attend to (packed
rows), position_ids the RoPE positions.
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


class Config:
    def __init__(self, d):
        self.d = d
        self.model_type = d["model_type"]
        assert self.model_type in ("qwen2", "llama", "qwen3")
        self.vocab_size = d["vocab_size"]
        self.hidden_size = d["hidden_size"]
        self.intermediate_size = d["intermediate_size"]
        self.num_hidden_layers = d["num_hidden_layers"]
        self.num_attention_heads = d["num_attention_heads"]
        self.num_key_value_heads = d.get("num_key_value_heads") or d["num_attention_heads"]
        self.head_dim = d.get("head_dim") or self.hidden_size // self.num_attention_heads
        self.max_position_embeddings = d["max_position_embeddings"]
        self.rms_norm_eps = d["rms_norm_eps"]
        self.tie_word_embeddings = d.get("tie_word_embeddings", False)
        attention_bias = d.get("attention_bias", False)
        self.qkv_bias = self.model_type == "qwen2" or attention_bias
        self.o_bias = self.model_type != "qwen2" and attention_bias
        self.mlp_bias = self.model_type == "llama" and d.get("mlp_bias", False)
        self.qk_norm = self.model_type == "qwen3"
        # transformers 5 keeps rope_theta and the scaling in rope_parameters
        rp = d.get("rope_parameters")
        if rp is not None:
            self.rope = dict(rp)
            self.rope.setdefault("rope_theta", d.get("rope_theta"))
        else:
            self.rope = dict(d.get("rope_scaling") or {})
            self.rope["rope_theta"] = d["rope_theta"]
        self.rope_type = self.rope.get("rope_type", self.rope.get("type", "default"))
        assert not d.get("use_sliding_window", False)
        assert all(t == "full_attention" for t in d.get("layer_types", []))

    @classmethod
    def from_file(cls, path):
        with open(path) as f:
            return cls(json.load(f))


def rope_init(cfg, seq_len=None, dtype=torch.float64):
    """(inv_freq [Dh/2], attention_factor) of the config's RoPE type, as
    modeling_rope_utils.py's _compute_*_parameters compute them."""
    rp, dim, max_pos = cfg.rope, cfg.head_dim, cfg.max_position_embeddings
    base = rp["rope_theta"]
    t = cfg.rope_type
    arange = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype)

    def default(b):
        return 1.0 / (b ** (arange / dim))

    if t == "default":
        return default(base), 1.0
    if t == "linear":
        return default(base) / rp["factor"], 1.0
    if t == "dynamic":
        factor = rp["factor"]
        n = max(seq_len, max_pos) if seq_len is not None else max_pos
        b = base * ((factor * n / max_pos) - (factor - 1)) ** (dim / (dim - 2))
        return default(b), 1.0
    if t == "llama3":
        inv = default(base)
        factor, lf, hf = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
        old = rp["original_max_position_embeddings"]
        low_wl, high_wl = old / lf, old / hf
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old / wavelen - lf) / (hf - lf)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
        return torch.where(medium, smoothed, inv_l), 1.0
    if t == "yarn":
        factor = rp.get("factor")
        orig = rp.get("original_max_position_embeddings") or max_pos
        if factor is None:
            factor = max_pos / orig

        def get_mscale(scale, m=1):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        af = rp.get("attention_factor")
        if af is None:
            ms, msa = rp.get("mscale"), rp.get("mscale_all_dim")
            af = get_mscale(factor, ms) / get_mscale(factor, msa) if ms and msa else get_mscale(factor)
        beta_fast = rp.get("beta_fast") or 32
        beta_slow = rp.get("beta_slow") or 1

        def corr_dim(n_rot):
            return (dim * math.log(orig / (n_rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if rp.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=dtype) - low) / (high - low), 0, 1)
        pos_freqs = base ** (arange / dim)
        extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
        ext_factor = 1 - ramp
        return inter * (1 - ext_factor) + extra * ext_factor, af
    raise ValueError(f"rope_type {t!r}")


def rope_cos_sin(cfg, positions, dtype):
    """cos, sin [B, S, Dh] for integer positions [B, S]."""
    seq_len = int(positions.max().item()) + 1
    inv, af = rope_init(cfg, seq_len, dtype)
    freqs = positions.to(dtype)[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos() * af, emb.sin() * af


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x, cos, sin):
    """x [B, heads, S, Dh]; cos, sin [B, S, Dh]."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        H, Hkv, Dh, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        self.q_proj = nn.Linear(D, H * Dh, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(D, Hkv * Dh, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(D, Hkv * Dh, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(H * Dh, D, bias=cfg.o_bias)
        if cfg.qk_norm:  # Qwen3Attention registers them after o_proj
            self.q_norm = RMSNorm(Dh, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(Dh, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, record=None, prefix=""):
        B, S, _ = x.shape
        cfg = self.cfg
        H, Hkv, Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q = self.q_proj(x).view(B, S, H, Dh)
        k = self.k_proj(x).view(B, S, Hkv, Dh)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(B, S, Hkv, Dh).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = H // Hkv
        kr, vr = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # repeat_kv
        scores = (q @ kr.transpose(-1, -2)) * (Dh ** -0.5)
        scores = scores.masked_fill(~mask[:, None], float("-inf"))
        ctx = (torch.softmax(scores, dim=-1) @ vr).transpose(1, 2).reshape(B, S, H * Dh)
        out = self.o_proj(ctx)
        if record is not None:
            record[prefix + "attn.q"] = q.transpose(1, 2).reshape(B * S, H * Dh)
            record[prefix + "attn.k"] = k.transpose(1, 2).reshape(B * S, Hkv * Dh)
            record[prefix + "attn.v"] = v.transpose(1, 2).reshape(B * S, Hkv * Dh)
            record[prefix + "attn.context"] = ctx.reshape(B * S, H * Dh)
        return out


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        D, I, b = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = nn.Linear(D, I, bias=b)
        self.up_proj = nn.Linear(D, I, bias=b)
        self.down_proj = nn.Linear(I, D, bias=b)

    def forward(self, x, record=None, prefix=""):
        h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        out = self.down_proj(h)
        if record is not None:
            record[prefix + "mlp.hidden"] = h.reshape(-1, h.shape[-1])
            record[prefix + "mlp.out"] = out.reshape(-1, out.shape[-1])
        return out


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h, cos, sin, mask, record=None, prefix=""):
        D = h.shape[-1]
        n = self.input_layernorm(h)
        if record is not None:
            record[prefix + "input_layernorm"] = n.reshape(-1, D)
        a = self.self_attn(n, cos, sin, mask, record, prefix)
        h = h + a
        n = self.post_attention_layernorm(h)
        if record is not None:
            record[prefix + "attn.out"] = a.reshape(-1, D)
            record[prefix + "attn.state"] = h.reshape(-1, D)
            record[prefix + "post_attention_layernorm"] = n.reshape(-1, D)
        h = h + self.mlp(n, record, prefix)
        if record is not None:
            record[prefix + "state"] = h.reshape(-1, D)
        return h


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class ForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Model(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def head_weight(self):
        return self.model.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    def forward(self, input_ids, labels=None, position_ids=None, segment_start=None, record=None):
        B, S = input_ids.shape
        dtype = self.model.embed_tokens.weight.dtype
        if position_ids is None:
            position_ids = torch.arange(S).expand(B, S)
        cos, sin = rope_cos_sin(self.cfg, position_ids, dtype)
        i = torch.arange(S)
        mask = (i[None, :, None] >= i[None, None, :]).expand(B, S, S)  # key <= query
        if segment_start is not None:
            mask = mask & (i[None, None, :] >= segment_start[:, :, None])
        h = self.model.embed_tokens(input_ids)
        for l, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, mask, record, f"layers.{l}.")
        hn = self.model.norm(h)
        logits = F.linear(hn, self.head_weight())
        if record is not None:
            record["final_hidden"] = hn.reshape(B * S, -1)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                          labels[:, 1:].reshape(-1), ignore_index=-100)
        return out


def load_model(model_dir, dtype=torch.float32):
    """Build from config.json and load model.safetensors with strict name/shape checks."""
    cfg = Config.from_file(os.path.join(model_dir, "config.json"))
    model = ForCausalLM(cfg)
    tensors, _ = st.load(os.path.join(model_dir, "model.safetensors"))
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if set(want) != set(got):
        raise ValueError(f"checkpoint names differ: missing {sorted(set(want) - set(got))[:10]} "
                         f"extra {sorted(set(got) - set(want))[:10]}")
    bad = [(k, got[k], want[k]) for k in want if got[k] != want[k]]
    if bad:
        raise ValueError(f"checkpoint shapes differ: {bad[:10]}")
    model.load_state_dict({k: torch.from_numpy(v.astype("float32")) for k, v in tensors.items()}, strict=True)
    model.to(dtype)
    model.eval()
    return model


def save_model(model, model_dir, config_dict):
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config_dict, f, indent=2)
        f.write("\n")
    sd = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    st.save(os.path.join(model_dir, "model.safetensors"), sd)
