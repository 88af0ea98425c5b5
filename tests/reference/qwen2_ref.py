"""Qwen2 / Qwen2.5 (Qwen2ForCausalLM) as a plain PyTorch module, written from
the architecture's description (docs/architecture.md, "Qwen2 family"; the
spec's §3), not from transformers, which is not used here.

    h = embed_tokens[ids]
    per layer:  h = h + o_proj(attention(input_layernorm(h)))
                h = h + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = post_attention_layernorm(h)
    logits = lm_head(norm(h))          (embed_tokens' matrix when tie_word_embeddings)

Attention: q/k/v Linear with bias, o_proj without; K/V heads repeated
num_attention_heads / num_key_value_heads times (consecutive query heads
share one K/V head); RoPE over the whole head, rotate_half (NeoX) layout:
x' = x*cos + rotate_half(x)*sin with rotate_half(x) = cat(-x2, x1),
inv_freq_j = theta^(-2j/Dh), emb = cat(freqs, freqs); scores scaled by
Dh^-0.5, causal, softmax.

forward(ids, labels=None, position_ids=None, segment_start=None,
record=None) also supports packed rows: segment_start[b, s] is the first
key position query s may attend to (block-diagonal causal mask), and
position_ids the RoPE positions.
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
        self.vocab_size = d["vocab_size"]
        self.hidden_size = d["hidden_size"]
        self.intermediate_size = d["intermediate_size"]
        self.num_hidden_layers = d["num_hidden_layers"]
        self.num_attention_heads = d["num_attention_heads"]
        self.num_key_value_heads = d.get("num_key_value_heads", d["num_attention_heads"])
        self.head_dim = d.get("head_dim") or self.hidden_size // self.num_attention_heads
        self.max_position_embeddings = d["max_position_embeddings"]
        self.rms_norm_eps = d["rms_norm_eps"]
        self.rope_theta = d["rope_theta"]
        self.tie_word_embeddings = d["tie_word_embeddings"]
        self.initializer_range = d.get("initializer_range", 0.02)
        assert self.num_attention_heads % self.num_key_value_heads == 0
        assert not d.get("use_sliding_window", False) and d.get("rope_scaling") is None

    @classmethod
    def from_file(cls, path):
        with open(path) as f:
            return cls(json.load(f))


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rope_cos_sin(cfg, positions, dtype):
    """cos, sin [B, S, Dh] for integer positions [B, S], computed in dtype."""
    Dh = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, Dh, 2, dtype=dtype) / Dh))
    freqs = positions.to(dtype)[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


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
        self.q_proj = nn.Linear(D, H * Dh, bias=True)
        self.k_proj = nn.Linear(D, Hkv * Dh, bias=True)
        self.v_proj = nn.Linear(D, Hkv * Dh, bias=True)
        self.o_proj = nn.Linear(H * Dh, D, bias=False)

    def forward(self, x, cos, sin, mask, record=None, prefix=""):
        B, S, _ = x.shape
        cfg = self.cfg
        H, Hkv, Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q = self.q_proj(x).view(B, S, H, Dh).transpose(1, 2)
        k = self.k_proj(x).view(B, S, Hkv, Dh).transpose(1, 2)
        v = self.v_proj(x).view(B, S, Hkv, Dh).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = H // Hkv
        kr = k.repeat_interleave(rep, dim=1)      # query head i reads K/V head i // rep
        vr = v.repeat_interleave(rep, dim=1)
        scores = (q @ kr.transpose(-1, -2)) * (Dh ** -0.5)
        scores = scores.masked_fill(~mask[:, None], float("-inf"))
        ctx = torch.softmax(scores, dim=-1) @ vr   # [B, H, S, Dh]
        ctx = ctx.transpose(1, 2).reshape(B, S, H * Dh)
        out = self.o_proj(ctx)
        if record is not None:
            record[prefix + "attn.q"] = q.transpose(1, 2).reshape(B * S, H * Dh)
            record[prefix + "attn.k"] = k.transpose(1, 2).reshape(B * S, Hkv * Dh)
            record[prefix + "attn.v"] = v.transpose(1, 2).reshape(B * S, Hkv * Dh)
            record[prefix + "attn.context"] = ctx.reshape(B * S, H * Dh)
            record[prefix + "attn.out"] = out.reshape(B * S, -1)
        return out


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        D, I = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(D, I, bias=False)
        self.up_proj = nn.Linear(D, I, bias=False)
        self.down_proj = nn.Linear(I, D, bias=False)

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
        h = h + self.self_attn(n, cos, sin, mask, record, prefix)
        n = self.post_attention_layernorm(h)
        if record is not None:
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


class Qwen2ForCausalLM(nn.Module):
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
        mask = (i[None, :, None] >= i[None, None, :]).expand(B, S, S)   # key <= query
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
            # mean over scored targets: row s predicts labels[s+1]; -100 ignored
            out["loss"] = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                          labels[:, 1:].reshape(-1), ignore_index=-100)
        return out


def load_model(model_dir, dtype=torch.float32):
    """Build from config.json and load model.safetensors with strict name/shape checks."""
    cfg = Config.from_file(os.path.join(model_dir, "config.json"))
    model = Qwen2ForCausalLM(cfg)
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


def param_count(cfg):
    """Parameters of a config, from the shapes (no model built)."""
    D, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    HD, KVD = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    layer = (D * HD + HD) + 2 * (D * KVD + KVD) + HD * D + 3 * D * I + 2 * D
    return V * D + cfg.num_hidden_layers * layer + D + (0 if cfg.tie_word_embeddings else V * D)


if __name__ == "__main__":
    for name, d in [("Qwen2.5-0.5B", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                          num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                          max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1e6,
                                          tie_word_embeddings=True)),
                    ("Qwen2.5-7B", dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                                        num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                                        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1e6,
                                        tie_word_embeddings=False))]:
        print(f"{name}: {param_count(Config(d)):,} parameters")
