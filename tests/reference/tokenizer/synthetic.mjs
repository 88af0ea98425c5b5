// Small tokenizers that use the features the real files do not (Split
// behaviours, invert, String patterns, ByteLevel's own regex and prefix
// space, added-token flags, templates, ignore_merges, no ByteLevel), with
// their encodings by Hugging Face's tokenizers, for tests/test_tokenizer.c.
// Their vocabulary: the 256 byte characters plus the results of the first
// 600 merges of the Qwen tokenizer.
import { Tokenizer as RustTokenizer } from "tokenizers";

const bytesToUnicode = () => {
  const keep = [];
  for (let b = 0x21; b <= 0x7e; b++) keep.push(b);
  for (let b = 0xa1; b <= 0xac; b++) keep.push(b);
  for (let b = 0xae; b <= 0xff; b++) keep.push(b);
  const map = new Map();
  let n = 0;
  for (let b = 0; b < 256; b++) map.set(b, String.fromCodePoint(keep.includes(b) ? b : 0x100 + n++));
  return map;
};

function tinyModel(qwenJson, nMerges, extra = {}) {
  const vocab = {};
  let id = 0;
  for (const ch of bytesToUnicode().values()) vocab[ch] = id++;
  const merges = [];
  for (const m of qwenJson.model.merges) {
    if (merges.length === nMerges) break;
    const [a, b] = Array.isArray(m) ? m : m.split(" ");
    if (!(a in vocab) || !(b in vocab)) continue;
    if (!((a + b) in vocab)) vocab[a + b] = id++;
    merges.push([a, b]);
  }
  return { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
           fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges, ...extra };
}

const split = (pattern, behavior, invert = false) => ({ type: "Split", pattern, behavior, invert });
const byteLevel = (add_prefix_space, use_regex) => ({ type: "ByteLevel", add_prefix_space, trim_offsets: false, use_regex });
const seq = (...pretokenizers) => ({ type: "Sequence", pretokenizers });
const added = (id, content, flags = {}) => ({ id, content, single_word: false, lstrip: false, rstrip: false,
                                              normalized: false, special: true, ...flags });

const TEXTS = [
  "Hello, world! It's 2024 -- the year of the whale.",
  "  leading spaces, trailing spaces   ",
  "a, b, c,, d ,e",
  "one\ttwo\n\nthree \r\n four",
  "123-456-7890 and 12 monkeys",
  "caf\u0065\u0301 na\u00efve \u00c5 A\u030a",
  "ab<mask>cd <mask> ef  <mask>  gh",
  "[word] x[word] [word]y ([word]) word[word]",
  "<norm> <n\u006f\u0308rm> <nörm>",
  "<s>inside</s> text",
  "🐳 whales 🐋 and 中文 text",
  "",
  " ",
  "tokenization tokenizer tokens",
];

export function syntheticVariants(qwenJson) {
  const base = (over) => ({ version: "1.0", truncation: null, padding: null, added_tokens: [], normalizer: null,
                            pre_tokenizer: null, post_processor: null, decoder: { type: "ByteLevel", add_prefix_space: false,
                            trim_offsets: false, use_regex: false }, ...over });
  const model = tinyModel(qwenJson, 600);
  const n = Object.keys(model.vocab).length;
  return [
    { name: "merged_prev", json: base({ model, pre_tokenizer: seq(split({ Regex: "\\s+" }, "MergedWithPrevious"), byteLevel(false, false)) }) },
    { name: "merged_next", json: base({ model, pre_tokenizer: seq(split({ Regex: "\\p{P}" }, "MergedWithNext"), byteLevel(false, false)) }) },
    { name: "contiguous_invert", json: base({ model, pre_tokenizer: seq(split({ Regex: "\\p{L}" }, "Contiguous", true), byteLevel(false, false)) }) },
    { name: "removed_string", json: base({ model, pre_tokenizer: seq(split({ String: ", " }, "Removed"), byteLevel(false, false)) }) },
    { name: "isolated_invert_digits", json: base({ model, pre_tokenizer: seq(split({ Regex: "\\d+" }, "Isolated", true), byteLevel(false, false)) }) },
    { name: "gpt2_prefix_template", json: base({
        model, pre_tokenizer: byteLevel(true, true),
        added_tokens: [added(n, "<s>"), added(n + 1, "</s>")],
        post_processor: { type: "TemplateProcessing",
          single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "</s>", type_id: 0 } }],
          pair: [{ Sequence: { id: "A", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }],
          special_tokens: { "<s>": { id: "<s>", ids: [n], tokens: ["<s>"] }, "</s>": { id: "</s>", ids: [n + 1], tokens: ["</s>"] } } } }) },
    { name: "added_flags_nfc", json: base({
        model: { ...model, ignore_merges: true }, normalizer: { type: "NFC" }, pre_tokenizer: byteLevel(false, true),
        added_tokens: [added(n, "<mask>", { lstrip: true, rstrip: true }), added(n + 1, "[word]", { single_word: true, special: false }),
                       added(n + 2, "<n\u006f\u0308rm>", { normalized: true, special: false })] }) },
    { name: "no_pretokenizer", json: base({ model }) },
  ].map((v) => ({ ...v, texts: TEXTS }));
}

export async function syntheticGoldens(qwenJson) {
  const out = [];
  for (const v of syntheticVariants(qwenJson)) {
    const tok = RustTokenizer.fromString(JSON.stringify(v.json));
    const cases = [];
    for (const text of v.texts) {
      for (const addSpecial of [false, true]) {
        const ids = Array.from((await tok.encode(text, null, { addSpecialTokens: addSpecial })).getIds());
        const decoded = ids.length ? await tok.decode(ids, false) : "";
        const decodedSkip = ids.length ? await tok.decode(ids, true) : "";
        cases.push({ text, add_special: addSpecial, ids, decoded, decoded_skip_special: decodedSkip });
      }
    }
    out.push({ name: v.name, tokenizer: v.json, cases });
  }
  return out;
}
