// Cross-check of a tokenizer written by `whale tokenizer train`: the ids of
// the C tokenizer (`whale tokenize`) must equal those of Hugging Face's
// pure-JS @huggingface/tokenizers and of `tokenizers` (the Rust library's
// Node binding).
//
//   node check.mjs [--whale BIN] [--docs N] TOKENIZER_DIR FILE...
//
// FILE: plain text (checked whole, then paragraph by paragraph) or .jsonl
// (each line's "text" is one document). At most N documents per file
// (default 400, spread evenly), plus a few chat-formatted texts. Each C
// encoding is one `whale tokenize -m DIR --file F` run. Exit status 0 when
// everything agrees.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { Tokenizer as JsTokenizer } from "@huggingface/tokenizers";
import { Tokenizer as RustTokenizer } from "tokenizers";

const args = process.argv.slice(2);
let whale = "build/whale";
let maxDocs = 400;
const rest = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--whale") whale = args[++i];
  else if (args[i] === "--docs") maxDocs = Number(args[++i]);
  else rest.push(args[i]);
}
if (rest.length < 2) {
  console.error("usage: node check.mjs [--whale BIN] [--docs N] TOKENIZER_DIR FILE...");
  process.exit(2);
}
const [dir, ...files] = rest;

const json = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
const js = new JsTokenizer(json, config);
const rust = RustTokenizer.fromFile(path.join(dir, "tokenizer.json"));
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "bpe-check-"));

function whaleIds(text) {
  const f = path.join(tmp, "text");
  fs.writeFileSync(f, text);
  const out = execFileSync(whale, ["tokenize", "-m", dir, "--file", f], { maxBuffer: 1 << 30 }).toString().trim();
  return out === "" ? [] : out.split(",").map(Number);
}

const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const firstDiff = (a, b) => {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
};

let checked = 0, ids = 0, failures = 0;
async function check(name, text) {
  const c = whaleIds(text);
  const j = js.encode(text, { add_special_tokens: false }).ids;
  const r = Array.from((await rust.encode(text, null, { addSpecialTokens: false })).getIds());
  const back = j.length ? js.decode(j, { skip_special_tokens: false }) : "";
  checked++;
  ids += c.length;
  if (same(c, j) && same(c, r) && back === text) return;
  failures++;
  const k = Math.min(firstDiff(c, j), firstDiff(c, r));
  console.error(`DIFFERS ${name}: whale ${c.length} ids, js ${j.length}, rust ${r.length}; first difference at ${k}:` +
    ` whale ${c[k]} js ${j[k]} rust ${r[k]}${back === text ? "" : " (js decode differs from the text)"}`);
}

function spread(list) {
  if (list.length <= maxDocs) return list;
  const out = [];
  for (let i = 0; i < maxDocs; i++) out.push(list[Math.floor((i * list.length) / maxDocs)]);
  return out;
}

for (const file of files) {
  const raw = fs.readFileSync(file, "utf8"); // invalid UTF-8 -> U+FFFD, as the C tokenizer does
  let docs;
  if (file.endsWith(".jsonl")) {
    docs = raw.split("\n").filter((l) => l.trim() !== "").map((l) => JSON.parse(l).text);
  } else {
    await check(`${file} (whole, ${Buffer.byteLength(raw)} bytes)`, raw);
    docs = raw.split(/\n\n+/).filter((d) => d !== "");
  }
  const picked = spread(docs);
  for (let i = 0; i < picked.length; i++) await check(`${file} document ${i}`, picked[i]);
}

// chat-formatted text: what DeepSeek-V3's template renders
const B = "<｜begin▁of▁sentence｜>", E = "<｜end▁of▁sentence｜>", U = "<｜User｜>", A = "<｜Assistant｜>";
const chats = [
  `${B}You are a helpful assistant.${U}What is 2+2?${A}2 + 2 = 4.${E}${U}And in 日本語?${A}`,
  `${U}${A}${E}${E}<｜▁pad▁｜><｜▁pad▁｜>`,
  `text${U} spaced ${A}\n\nnewlines${E}tail`,
];
for (let i = 0; i < chats.length; i++) await check(`chat ${i}`, chats[i]);
const single = [B, E, "<｜▁pad▁｜>", U, A].map((t) => js.encode(t, { add_special_tokens: false }).ids);
if (!single.every((x) => x.length === 1)) {
  failures++;
  console.error(`DIFFERS: special tokens are not single ids in the JS tokenizer: ${JSON.stringify(single)}`);
}

fs.rmSync(tmp, { recursive: true, force: true });
console.log(`${checked} texts, ${ids} ids: ${failures ? failures + " differ" : "whale = @huggingface/tokenizers = tokenizers (Rust) on all"}`);
process.exit(failures ? 1 : 0);
