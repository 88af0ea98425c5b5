// Trains on the same text with `whale tokenizer train` and with Hugging
// Face's own BpeTrainer (the Rust library, through the `tokenizers` Node
// binding) and compares the merges, which must be identical.
//
//   node compare_trainer.mjs [--whale BIN] [--vocab N] FILE...
//
// FILEs are valid UTF-8 text, concatenated. The binding's Tokenizer.train(files) feeds the
// trainer one line at a time (each with its "\n") and uses the default
// BpeTrainer (min_frequency 0, vocab 30000); so whale gets the lines as
// .jsonl documents and --min-frequency 1. The pre-tokenizer is the one whale
// writes. Whale's first N merges must equal Hugging Face's first N (N =
// whale's count; Hugging Face goes on to 30000). Known difference: whale cuts
// pre-tokens longer than 256 bytes for training, so text with such runs
// (megabyte-long words) gives different merges.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { Tokenizer } from "tokenizers";

const args = process.argv.slice(2);
let whale = "build/whale";
let vocab = 8192;
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--whale") whale = args[++i];
  else if (args[i] === "--vocab") vocab = Number(args[++i]);
  else files.push(args[i]);
}
if (!files.length) {
  console.error("usage: node compare_trainer.mjs [--whale BIN] [--vocab N] FILE...");
  process.exit(2);
}

// Hugging Face's trainer treats the added tokens (<｜User｜>, ...) as plain
// text, whale cuts them out as encoding does: give both the text without them.
const added = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>"];
let text = files.map((f) => fs.readFileSync(f, "utf8")).join("");
for (const t of added) text = text.split(t).join("");
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "bpe-compare-"));
const input = path.join(tmp, "input.txt"), lines = path.join(tmp, "lines.jsonl");
fs.writeFileSync(input, text);
fs.writeFileSync(lines, text.split(/(?<=\n)/).filter((l) => l !== "").map((l) => JSON.stringify({ text: l }) + "\n").join(""));

let t0 = Date.now();
execFileSync(whale, ["tokenizer", "train", "--quiet", "--vocab-size", String(vocab), "--min-frequency", "1",
  "--out", path.join(tmp, "whale"), lines], { stdio: ["ignore", "ignore", "inherit"] });
const whaleSeconds = (Date.now() - t0) / 1000;
const ours = JSON.parse(fs.readFileSync(path.join(tmp, "whale", "tokenizer.json"), "utf8"));

// the same tokenizer with an empty model, trained by Hugging Face
const empty = structuredClone(ours);
empty.added_tokens = [];
empty.model.vocab = {};
empty.model.merges = [];
const hf = Tokenizer.fromString(JSON.stringify(empty));
t0 = Date.now();
hf.train([input]);
const hfSeconds = (Date.now() - t0) / 1000;
hf.save(path.join(tmp, "hf.json"));
const theirs = JSON.parse(fs.readFileSync(path.join(tmp, "hf.json"), "utf8"));

const pair = (m) => (Array.isArray(m) ? m.join(" ") : m);
const a = ours.model.merges.map(pair), b = theirs.model.merges.map(pair);
let k = 0;
while (k < a.length && k < b.length && a[k] === b[k]) k++;
fs.rmSync(tmp, { recursive: true, force: true });
console.log(`whale: ${a.length} merges in ${whaleSeconds.toFixed(2)} s; Hugging Face BpeTrainer: ${b.length} merges in ${hfSeconds.toFixed(2)} s`);
if (k === a.length) {
  console.log(`identical: all ${a.length} of whale's merges equal Hugging Face's first ${a.length}`);
  process.exit(0);
}
console.error(`DIFFER at merge ${k}: whale ${JSON.stringify(a.slice(k, k + 3))} vs Hugging Face ${JSON.stringify(b.slice(k, k + 3))}`);
process.exit(1);
