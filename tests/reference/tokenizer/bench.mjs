// Encode speed of Hugging Face's tokenizers on the text bench/bench_tokenizer.c
// uses (corpus.jsonl entries + "\n", repeated to MB megabytes), for the ratio.
//
//   cd tests/reference/tokenizer && npm ci && node bench.mjs [MB]
//
// Prints one JSON line per tokenizer and library. The Rust binding may use
// several threads inside one encode call; run under `taskset -c 0` for one core.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Tokenizer as RustTokenizer } from "tokenizers";
import { Tokenizer as JsTokenizer } from "@huggingface/tokenizers";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../../..");
const tokDir = process.env.WHALE_TOKENIZERS
  ? path.resolve(process.env.WHALE_TOKENIZERS)
  : path.join(root, ".cache/tokenizers");
const mb = Number(process.argv[2] ?? 10);

const lines = fs
  .readFileSync(path.join(root, "tests/data/tokenizer/corpus.jsonl"), "utf8")
  .split("\n")
  .filter((l) => l.trim() !== "")
  .map((l) => JSON.parse(l).text);
const want = mb * 1e6;
const parts = [];
let bytes = 0;
while (bytes < want) {
  for (const t of lines) {
    if (bytes >= want) break;
    parts.push(t + "\n");
    bytes += Buffer.byteLength(t) + 1;
  }
}
const text = parts.join("");

// FNV-1a over the ids' 32-bit little-endian bytes (bench_tokenizer prints the same)
const idsHash = (ids) => {
  let h = 0xcbf29ce484222325n;
  for (const id of ids) for (let k = 0; k < 4; k++) h = ((h ^ BigInt((id >>> (8 * k)) & 255)) * 0x100000001b3n) & 0xffffffffffffffffn;
  return h.toString(16).padStart(16, "0");
};

const best = async (fn, reps) => {
  let b = Infinity, n = 0;
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    n = await fn();
    b = Math.min(b, (performance.now() - t0) / 1e3);
  }
  return [b, n];
};

for (const name of ["deepseek_v3", "qwen3"]) {
  const dir = path.join(tokDir, name);
  const rust = RustTokenizer.fromFile(path.join(dir, "tokenizer.json"));
  let hash = "";
  const [rs, rn] = await best(async () => {
    const ids = (await rust.encode(text, null, { addSpecialTokens: false })).getIds();
    hash = idsHash(ids);
    return ids.length;
  }, 2);
  console.log(JSON.stringify({ tokenizer: name, impl: "tokenizers (Rust) 0.23.2, one call", bytes, ids: rn, ids_fnv: hash, encode_s: +rs.toFixed(3), encode_mb_s: +(bytes / rs / 1e6).toFixed(1) }));
  // the same text as one call per corpus entry (how it is usually called)
  const [bs, bn] = await best(async () => (await rust.encodeBatch(parts, { addSpecialTokens: false })).reduce((a, e) => a + e.getIds().length, 0), 2);
  console.log(JSON.stringify({ tokenizer: name, impl: "tokenizers (Rust) 0.23.2, encodeBatch of entries", bytes, ids: bn, encode_s: +bs.toFixed(3), encode_mb_s: +(bytes / bs / 1e6).toFixed(1) }));
  const json = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const js = new JsTokenizer(json, config);
  const [js_s, jn] = await best(async () => js.encode(text, { add_special_tokens: false }).ids.length, 1);
  console.log(JSON.stringify({ tokenizer: name, impl: "@huggingface/tokenizers (JS) 0.2.0", bytes, ids: jn, encode_s: +js_s.toFixed(3), encode_mb_s: +(bytes / js_s / 1e6).toFixed(1) }));
}
