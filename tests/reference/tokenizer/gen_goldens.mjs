// Golden encodings for tests/test_tokenizer.c, made with Hugging Face's own
// tokenizers: `tokenizers` (the Rust library's Node binding, the reference)
// and `@huggingface/tokenizers` (the pure-JS port, as a cross-check).
//
//   cd tests/reference/tokenizer && npm ci && node gen_goldens.mjs
//
//   node gen_goldens.mjs llama3     only that tokenizer's golden
//
// Reads tests/data/tokenizer/corpus.jsonl and the tokenizer files fetched by
// scripts/fetch-tokenizers.sh ($WHALE_TOKENIZERS, default .cache/tokenizers),
// writes tests/data/tokenizer/golden-<name>.json, and golden-synthetic.json
// for small tokenizers built by synthetic.mjs. Entries the two libraries
// disagree on are listed on stderr and marked "js_differs" in the golden.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Tokenizer as RustTokenizer } from "tokenizers";
import { Tokenizer as JsTokenizer } from "@huggingface/tokenizers";
import { generatedTexts } from "./generated.mjs";
import { syntheticGoldens } from "./synthetic.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../../..");
const dataDir = path.join(root, "tests/data/tokenizer");
const tokDir = process.env.WHALE_TOKENIZERS
  ? path.resolve(process.env.WHALE_TOKENIZERS)
  : path.join(root, ".cache/tokenizers");

const corpus = fs
  .readFileSync(path.join(dataDir, "corpus.jsonl"), "utf8")
  .split("\n")
  .filter((l) => l.trim() !== "")
  .map((l) => JSON.parse(l));

const sameIds = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

async function run(name) {
  const dir = path.join(tokDir, name);
  const json = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const rust = RustTokenizer.fromFile(path.join(dir, "tokenizer.json"));
  const js = new JsTokenizer(json, config);

  // transformers' decode applies clean_up_tokenization after the library's
  // when tokenizer_config.json asks for it (Llama 3 does)
  const cleaning = config.clean_up_tokenization_spaces === true;
  const pats = [[" .", "."], [" ?", "?"], [" !", "!"], [" ,", ","], [" ' ", "'"], [" n't", "n't"],
                [" 'm", "'m"], [" 's", "'s"], [" 've", "'ve"], [" 're", "'re"]];
  const cleanUp = (s) => (cleaning ? pats.reduce((acc, [a, b]) => acc.replaceAll(a, b), s) : s);
  const entries = [];
  let jsDiffs = 0;
  for (const { name: entryName, text } of corpus) {
    const enc = await rust.encode(text, null, { addSpecialTokens: false });
    const ids = Array.from(enc.getIds());
    const decoded = cleanUp(ids.length ? await rust.decode(ids, false) : "");
    const decodedSkip = cleanUp(ids.length ? await rust.decode(ids, true) : "");
    const jsIds = js.encode(text, { add_special_tokens: false }).ids;
    const e = { name: entryName, ids, decoded, decoded_skip_special: decodedSkip };
    if (!sameIds(ids, jsIds)) {
      e.js_differs = true;
      jsDiffs++;
      console.error(`${name}: ${entryName}: JS port differs\n  rust ${JSON.stringify(ids)}\n  js   ${JSON.stringify(jsIds)}`);
    }
    if (withSpecial.includes(entryName)) {
      // add_special_tokens=true: what the post-processor's template adds (Llama 3: <|begin_of_text|>)
      e.ids_with_special = Array.from((await rust.encode(text, null, { addSpecialTokens: true })).getIds());
      const jsSpecial = js.encode(text, { add_special_tokens: true }).ids;
      if (!sameIds(e.ids_with_special, jsSpecial)) {
        e.js_differs = true;
        jsDiffs++;
        console.error(`${name}: ${entryName}: JS port differs with special tokens`);
      }
    }
    entries.push(e);
  }

  const generated = [];
  for (const { name: genName, rule, text } of generatedTexts()) {
    const enc = await rust.encode(text, null, { addSpecialTokens: false });
    const ids = Array.from(enc.getIds());
    const jsIds = js.encode(text, { add_special_tokens: false }).ids;
    const g = { name: genName, rule, bytes: Buffer.byteLength(text), ids };
    if (!sameIds(ids, jsIds)) {
      g.js_differs = true;
      jsDiffs++;
      console.error(`${name}: ${genName}: JS port differs (${ids.length} vs ${jsIds.length} ids)`);
    }
    generated.push(g);
  }

  // ByteFallback decoding of byte-token runs that are not valid UTF-8
  // (one U+FFFD per byte of such a run), for tokenizers that have <0xNN>
  const byteId = (h) => rust.tokenToId(`<0x${h}>`);
  const byteRuns = [];
  if (byteId("E2") !== undefined && byteId("E2") !== null) {
    const word = rust.tokenToId("H");
    const runs = [["E2", "82"], ["E2", "82", "AC", "E2"], ["E2", word, "82"], ["F0", "9F", "90", "8B"], ["F0", "9F"],
                  ["E2", "82", "AC", word, "FF"]];
    for (const r of runs) {
      const ids = r.map((x) => (typeof x === "string" ? byteId(x) : x));
      byteRuns.push({ ids, decoded: await rust.decode(ids, false) });
    }
  }

  const out = {
    tokenizer: name,
    reference: "tokenizers 0.23.2 (Rust, Node binding); cross-checked with @huggingface/tokenizers 0.2.0",
    add_special_tokens: false,
    clean_up_tokenization_spaces: cleaning,
    vocab_size_with_added: rust.getVocabSize(true),
    entries,
    generated,
    ...(byteRuns.length ? { byte_runs: byteRuns } : {}),
  };
  const file = path.join(dataDir, `golden-${name}.json`);
  fs.writeFileSync(file, JSON.stringify(out) + "\n");
  console.log(`${file}: ${entries.length} corpus entries, ${generated.length} generated, JS port differs on ${jsDiffs}`);
}

// corpus entries also encoded with add_special_tokens=true
const withSpecial = ["empty", "hello", "prose", "chinese", "code_python"];
// node gen_goldens.mjs [NAME...]: only these real tokenizers (default: all, then the synthetic ones)
const names = process.argv.slice(2);
for (const name of names.length ? names : ["deepseek_v3", "qwen3", "llama3", "gemma3"]) await run(name);
if (names.length) process.exit(0);

// small tokenizers for the features the real files do not use
const qwenJson = JSON.parse(fs.readFileSync(path.join(tokDir, "qwen3", "tokenizer.json"), "utf8"));
const synthetic = await syntheticGoldens(qwenJson);
const synthFile = path.join(dataDir, "golden-synthetic.json");
fs.writeFileSync(synthFile, JSON.stringify({ reference: "tokenizers 0.23.2 (Rust, Node binding)", variants: synthetic }) + "\n");
console.log(`${synthFile}: ${synthetic.length} tokenizers, ${synthetic.reduce((a, v) => a + v.cases.length, 0)} cases`);
