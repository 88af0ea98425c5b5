// Read a GGUF file written by `whale export --format gguf` back with an
// independent reader (@huggingface/gguf) and check it against the Hugging
// Face folder it came from, with this file's own reading of config.json,
// tokenizer.json and model.safetensors:
//   - the architecture's hyperparameters under its prefix, with GGUF types;
//   - the tokenizer: tokens, token types, merges, pre-tokenizer, special
//     ids, add_bos/add_eos, chat template;
//   - every tensor: llama.cpp's name, the reversed shape, the type llama.cpp's
//     converter gives it, and its data: f32 bit for bit (Llama's q/k rows in
//     llama.cpp's RoPE order), f16/bf16 the nearest value, q8_0 within half
//     a quantisation step of its block (plus the fp16 rounding of the scale).
// usage: node check.mjs MODEL_DIR PRE FILE.gguf:TYPE...   (TYPE f32|f16|bf16|q8_0)
import { gguf, GGUFValueType } from "@huggingface/gguf";
import { readFileSync, existsSync, openSync, readSync, closeSync } from "node:fs";

const [dir, pre, ...files] = process.argv.slice(2);
let checks = 0, fails = 0, total = 0;
function check(what, ok, detail = "") {
  checks++;
  if (!ok) {
    fails++;
    console.error(`FAIL: ${what}${detail ? ": " + detail : ""}`);
  }
}

const cfg = JSON.parse(readFileSync(`${dir}/config.json`, "utf8"));
const tj = JSON.parse(readFileSync(`${dir}/tokenizer.json`, "utf8"));
const tc = existsSync(`${dir}/tokenizer_config.json`) ? JSON.parse(readFileSync(`${dir}/tokenizer_config.json`, "utf8")) : {};
const arch = cfg.model_type;
async function checkFile(file, want) {
const { metadata: md, typedMetadata: tm, tensorInfos, tensorDataOffset } =
  await gguf(file, { allowLocalFile: true, typedMetadata: true });

// ---------------------------------------------------------------- hyperparameters
const f32 = (x) => Math.fround(x);
const rope = cfg.rope_parameters ?? { rope_theta: cfg.rope_theta, ...(cfg.rope_scaling ?? {}) };
const headDim = cfg.head_dim ?? cfg.hidden_size / cfg.num_attention_heads;
const hp = {
  "general.architecture": [arch, GGUFValueType.STRING],
  "general.alignment": [32, GGUFValueType.UINT32],
  "general.file_type": [{ f32: 0, f16: 1, q8_0: 7, bf16: 32 }[want], GGUFValueType.UINT32],
  [`${arch}.block_count`]: [cfg.num_hidden_layers, GGUFValueType.UINT32],
  [`${arch}.context_length`]: [cfg.max_position_embeddings, GGUFValueType.UINT32],
  [`${arch}.embedding_length`]: [cfg.hidden_size, GGUFValueType.UINT32],
  [`${arch}.feed_forward_length`]: [cfg.intermediate_size, GGUFValueType.UINT32],
  [`${arch}.attention.head_count`]: [cfg.num_attention_heads, GGUFValueType.UINT32],
  [`${arch}.attention.head_count_kv`]: [cfg.num_key_value_heads ?? cfg.num_attention_heads, GGUFValueType.UINT32],
  [`${arch}.attention.key_length`]: [headDim, GGUFValueType.UINT32],
  [`${arch}.rope.freq_base`]: [f32(rope.rope_theta ?? 10000), GGUFValueType.FLOAT32],
  [`${arch}.attention.layer_norm_rms_epsilon`]: [f32(cfg.rms_norm_eps), GGUFValueType.FLOAT32],
  "tokenizer.ggml.model": ["gpt2", GGUFValueType.STRING],
  "tokenizer.ggml.pre": [pre, GGUFValueType.STRING],
};
if (arch === "llama") {
  hp["llama.vocab_size"] = [cfg.vocab_size, GGUFValueType.UINT32];
  hp["llama.rope.dimension_count"] = [headDim, GGUFValueType.UINT32];
}
for (const [k, [v, t]] of Object.entries(hp))
  check(`metadata ${k}`, md[k] === v && tm[k]?.type === t, `${md[k]} (type ${tm[k]?.type}), expected ${v} (type ${t})`);

// ---------------------------------------------------------------- tokenizer
const byId = new Map();
for (const [s, id] of Object.entries(tj.model.vocab)) byId.set(id, s);
const added = new Map(tj.added_tokens.map((a) => [a.id, a]));
for (const a of tj.added_tokens) byId.set(a.id, a.content);
const looksSpecial = (s) => ["<pad>", "<mask>", "<2mass>", "[@BOS@]"].includes(s) ||
  (s.startsWith("<|") && s.endsWith("|>")) || (s.startsWith("<｜") && s.endsWith("｜>")) ||
  (s.startsWith("<unused") && s.endsWith(">"));
const tokens = md["tokenizer.ggml.tokens"], types = md["tokenizer.ggml.token_type"];
check("token count", tokens.length === cfg.vocab_size && types.length === cfg.vocab_size, `${tokens.length}`);
let badTok = -1;
for (let i = 0; i < cfg.vocab_size && badTok < 0; i++) {
  const s = byId.get(i), a = added.get(i);
  const ws = s === undefined ? `[PAD${i}]` : a && !a.special && !looksSpecial(s) ? s.replaceAll("▁", " ") : s;
  const wt = s === undefined ? 5 : !a ? 1 : a.special || looksSpecial(s) ? 3 : 4;
  if (tokens[i] !== ws || types[i] !== wt) badTok = i;
}
check("tokens and token types", badTok < 0, badTok >= 0 ? `id ${badTok}: ${tokens[badTok]} / ${types[badTok]}` : "");
const merges = tj.model.merges.map((m) => (Array.isArray(m) ? m.join(" ") : m));
const gm = md["tokenizer.ggml.merges"];
check("merges", gm.length === merges.length && merges.every((m, i) => gm[i] === m), `${gm.length} of ${merges.length}`);
const content = (v) => (v && typeof v === "object" ? v.content : v);
const idOf = (s) => tj.added_tokens.find((a) => a.content === s)?.id ?? tj.model.vocab[s];
const specials = { bos: ["bos_token", "bos_token_id"], eos: ["eos_token", "eos_token_id"], padding: ["pad_token", "pad_token_id"] };
for (const [k, [tkey, ckey]] of Object.entries(specials)) {
  const fromTok = content(tc[tkey]) != null ? idOf(content(tc[tkey])) : undefined;
  const expect = fromTok ?? (typeof cfg[ckey] === "number" ? cfg[ckey] : undefined);
  check(`tokenizer.ggml.${k}_token_id`, md[`tokenizer.ggml.${k}_token_id`] === expect, `${md[`tokenizer.ggml.${k}_token_id`]}, expected ${expect}`);
}
const tmplBos = tj.post_processor?.type === "TemplateProcessing" && tj.post_processor.single[0]?.SpecialToken != null;
const addBos = tc.add_bos_token ?? tmplBos;
check("add_bos_token", md["tokenizer.ggml.add_bos_token"] === !!addBos, `${md["tokenizer.ggml.add_bos_token"]}`);
check("add_eos_token", md["tokenizer.ggml.add_eos_token"] === !!tc.add_eos_token);
const tmpl = existsSync(`${dir}/chat_template.jinja`) ? readFileSync(`${dir}/chat_template.jinja`, "utf8") : tc.chat_template;
check("chat template", md["tokenizer.chat_template"] === tmpl);

// ---------------------------------------------------------------- tensors
function safetensors(path) {
  const buf = readFileSync(path);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString("utf8"));
  delete header.__metadata__;
  return { buf, base: 8 + n, header };
}
const st = safetensors(`${dir}/model.safetensors`);
function values(name) {
  const e = st.header[name];
  const bytes = st.buf.subarray(st.base + e.data_offsets[0], st.base + e.data_offsets[1]);
  const n = e.shape.reduce((a, b) => a * b, 1), out = new Float32Array(n);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  for (let i = 0; i < n; i++)
    out[i] = e.dtype === "F32" ? dv.getFloat32(4 * i, true) : e.dtype === "BF16" ? bf16(dv.getUint16(2 * i, true)) : f16(dv.getUint16(2 * i, true));
  return { shape: e.shape, v: out };
}
function bf16(h) {
  const b = new DataView(new ArrayBuffer(4));
  b.setUint32(0, h << 16);
  return b.getFloat32(0);
}
function f16(h) {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 31, m = h & 1023;
  return e === 0 ? s * m * 2 ** -24 : e === 31 ? (m ? NaN : s * Infinity) : s * (1 + m / 1024) * 2 ** (e - 15);
}
// llama.cpp's converter reorders Llama's q/k rows: in each head, row 2j + s <- row s*dh/2 + j
function permuted(x, rows, cols, heads) {
  const out = new Float32Array(x.length), dh = rows / heads;
  for (let o = 0; o < rows; o++) {
    const h = Math.floor(o / dh), i = o % dh, src = h * dh + (i % 2) * (dh / 2) + Math.floor(i / 2);
    out.set(x.subarray(src * cols, (src + 1) * cols), o * cols);
  }
  return out;
}
const names = {
  "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight",
};
const layer = {
  input_layernorm: "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
  "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
  post_attention_layernorm: "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
};
function ggufName(hf) {
  if (names[hf]) return names[hf];
  const m = hf.match(/^model\.layers\.(\d+)\.(.+)\.(weight|bias)$/);
  return m && layer[m[2]] ? `blk.${m[1]}.${layer[m[2]]}.${m[3]}` : null;
}
const TYPE = { f32: 0, f16: 1, q8_0: 8, bf16: 30 };
const info = new Map(tensorInfos.map((t) => [t.name, t]));
const fd = openSync(file, "r");
function raw(t, nbytes) {
  const b = Buffer.alloc(nbytes);
  readSync(fd, b, 0, nbytes, Number(tensorDataOffset + t.offset));
  return new DataView(b.buffer, b.byteOffset, nbytes);
}
let expected = 0;
for (const hf of Object.keys(st.header)) {
  const name = ggufName(hf), t = name && info.get(name);
  expected++;
  check(`tensor ${hf} as ${name}`, !!t);
  if (!t) continue;
  const { shape, v } = values(hf);
  check(`${name} shape`, t.shape.map(Number).join() === [...shape].reverse().join(), `${t.shape} for ${shape}`);
  const cols = shape[shape.length - 1], rows = v.length / cols;
  const type = shape.length <= 1 || name.endsWith("_norm.weight") || !name.endsWith(".weight") ? 0
    : want === "q8_0" && cols % 32 ? 1 : TYPE[want];
  check(`${name} type`, t.dtype === type, `${t.dtype}, expected ${type}`);
  let x = v;
  const heads = /\.(q|k)_proj\./.exec(hf)?.[1];
  if (arch === "llama" && heads) {
    const n = heads === "q" ? cfg.num_attention_heads : cfg.num_key_value_heads ?? cfg.num_attention_heads;
    x = shape.length === 1 ? permuted(v, v.length, 1, n) : permuted(v, rows, cols, n);
  }
  let bad = -1;
  if (type === 0) {
    const d = raw(t, 4 * x.length);
    for (let i = 0; i < x.length && bad < 0; i++) if (!Object.is(d.getFloat32(4 * i, true), x[i])) bad = i;
  } else if (type === 1 || type === 30) {
    const d = raw(t, 2 * x.length), rel = type === 1 ? 2 ** -11 : 2 ** -8;
    for (let i = 0; i < x.length && bad < 0; i++) {
      const y = type === 1 ? f16(d.getUint16(2 * i, true)) : bf16(d.getUint16(2 * i, true));
      if (!(Math.abs(y - x[i]) <= rel * Math.abs(x[i]) + (type === 1 ? 2 ** -25 : 0))) bad = i;
    }
  } else {
    const d = raw(t, (x.length / 32) * 34);
    for (let b = 0; b < x.length / 32 && bad < 0; b++) {
      let amax = 0;
      for (let j = 0; j < 32; j++) amax = Math.max(amax, Math.abs(x[32 * b + j]));
      const scale = f16(d.getUint16(34 * b, true)), step = amax / 127;
      if (Math.abs(scale - step) > step * 2 ** -11 + 2 ** -25) bad = 32 * b;
      for (let j = 0; j < 32 && bad < 0; j++) {
        const q = d.getInt8(34 * b + 2 + j);
        if (q < -127 || Math.abs(q * scale - x[32 * b + j]) > step * (0.5 + 127 * 2 ** -11) + 2 ** -24) bad = 32 * b + j;
      }
    }
  }
  check(`${name} data (${["f32", "f16"][type] ?? (type === 8 ? "q8_0" : "bf16")})`, bad < 0, `value ${bad}`);
}
const ropeType = rope.rope_type ?? rope.type;
const extra = arch === "llama" && ropeType === "llama3" ? 1 : 0;
check("tensor count", tensorInfos.length === expected + extra, `${tensorInfos.length}, expected ${expected + extra}`);
if (extra) {
  // transformers' llama3 rule as the factors llama.cpp divides each frequency by
  const t = info.get("rope_freqs.weight"), half = headDim / 2, d = raw(t, 4 * half);
  const old = rope.original_max_position_embeddings, lo = old / rope.low_freq_factor, hi = old / rope.high_freq_factor;
  let bad = -1;
  for (let j = 0; j < half && bad < 0; j++) {
    const wl = 2 * Math.PI * (rope.rope_theta ?? 10000) ** ((2 * j) / headDim);
    const s = (old / wl - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
    const f = wl < hi ? 1 : wl > lo ? rope.factor : 1 / ((1 - s) / rope.factor + s);
    if (Math.abs(d.getFloat32(4 * j, true) - f) > 1e-6 * f) bad = j;
  }
  check("rope_freqs (llama3)", t && t.dtype === 0 && bad < 0, `factor ${bad}`);
}
closeSync(fd);
console.log(`${file.split("/").pop()}: ${checks - fails} passed, ${fails} failed`);
}
for (const fw of files) {
  const k = fw.lastIndexOf(":");
  checks = 0, fails = 0;
  await checkFile(fw.slice(0, k), fw.slice(k + 1));
  total += fails;
}
process.exit(total ? 1 : 0);
