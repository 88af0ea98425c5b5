// Goldens for tests/test_jinja.c: the real chat templates in
// tests/data/chat/templates/ (listed in templates.json with where each comes
// from and the special tokens transformers passes with it) rendered by
// @huggingface/jinja over template_cases.mjs, with the token ids from
// @huggingface/tokenizers where the tokenizer is one scripts/fetch-tokenizers.sh
// fetches; and jinja_snippets.mjs, small templates for the expression
// semantics.
//
//   scripts/fetch-tokenizers.sh
//   cd tests/reference/chat && npm ci && node gen_template_goldens.mjs
//
// Writes tests/data/chat/golden-jinja-<template>.json and
// tests/data/chat/golden-jinja-snippets.json.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";
import { Tokenizer } from "@huggingface/tokenizers";
import { cases } from "./template_cases.mjs";
import { snippets, snippetVars } from "./jinja_snippets.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../../..");
const dataDir = path.join(root, "tests/data/chat");
const tokDir = process.env.WHALE_TOKENIZERS
  ? path.resolve(process.env.WHALE_TOKENIZERS)
  : path.join(root, ".cache/tokenizers");
const readJson = (p) => JSON.parse(fs.readFileSync(p, "utf8"));
const generator = "tests/reference/chat/gen_template_goldens.mjs (@huggingface/jinja 0.5.11, @huggingface/tokenizers 0.2.0)";

// strftime_now at a fixed instant, so that templates that print today's date
// (gpt-oss, Llama 3.2) render the same every day: @huggingface/jinja's
// strftime_now reads the clock with new Date(), which here is that instant,
// in UTC; the C test sets SOURCE_DATE_EPOCH to it, which whale's
// strftime_now honours (in UTC too).
const sourceDateEpoch = 1718409600; // 2024-06-15 00:00:00 UTC
process.env.TZ = "UTC";
const RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...args) {
    if (args.length) super(...args);
    else super(sourceDateEpoch * 1000);
  }
};

// What apply_chat_template passes: the special tokens, messages, tools,
// add_generation_prompt and the extra keyword arguments.
function variables(specials, c) {
  const v = { ...specials, messages: c.messages, add_generation_prompt: c.add_generation_prompt };
  if (c.tools) v.tools = c.tools;
  return { ...v, ...(c.kwargs ?? {}) };
}

function render(compiled, vars) {
  try {
    const text = compiled.render(vars);
    // @huggingface/jinja prints a JavaScript object's toString where Jinja
    // raises (a dict added to a string): treat that as the error it is
    if (text.includes("[object ")) return { error: "a dict or list concatenated to a string" };
    return { text };
  } catch (e) {
    return { error: String(e.message ?? e) };
  }
}

// ms-swift's training text for Qwen3 (its qwen3 template: ChatML prompts,
// every reply as written with the empty thinking block in front of one that
// has none, earlier thinking kept under the default loss scale), up to the
// last reply's <|im_end|>: what whale's SFT text must be for the same
// conversation, made here without the Jinja template. Only for plain
// system/user/assistant conversations that end with a reply.
function swiftQwen3(c) {
  const m = c.messages;
  if (c.add_generation_prompt || c.tools || c.kwargs || m[m.length - 1].role !== "assistant") return undefined;
  let out = "";
  for (const [i, x] of m.entries()) {
    if (typeof x.content !== "string" || Object.keys(x).length !== 2 || x.content.startsWith("\n")) return undefined;
    if (x.role === "system" && i === 0) out += `<|im_start|>system\n${x.content}<|im_end|>\n`;
    else if (x.role === "user") out += `<|im_start|>user\n${x.content}<|im_end|>\n<|im_start|>assistant\n`;
    else if (x.role === "assistant" && i > 0 && m[i - 1].role === "user") {
      const reply = x.content.startsWith("<think>") ? x.content : "<think>\n\n</think>\n\n" + x.content;
      out += reply + "<|im_end|>" + (i === m.length - 1 ? "" : "\n");
    } else return undefined;
  }
  return out;
}

const tokenizers = {};
function tokenizer(name) {
  if (!name) return null;
  if (!tokenizers[name]) {
    const dir = path.join(tokDir, name);
    tokenizers[name] = new Tokenizer(readJson(path.join(dir, "tokenizer.json")), readJson(path.join(dir, "tokenizer_config.json")));
  }
  return tokenizers[name];
}

const table = readJson(path.join(here, "templates.json"));
for (const [name, t] of Object.entries(table)) {
  const source = fs.readFileSync(path.join(dataDir, "templates", t.template), "utf8");
  const compiled = new Template(source);
  const tok = tokenizer(t.tokenizer);
  const out = cases.map((c) => {
    const r = render(compiled, variables(t.specials, c));
    const entry = { name: c.name, add_generation_prompt: c.add_generation_prompt, messages: c.messages };
    if (c.tools) entry.tools = c.tools;
    if (c.kwargs) entry.kwargs = c.kwargs;
    const swift = name === "qwen3" ? swiftQwen3(c) : undefined;
    if (swift !== undefined) entry.swift_sft_text = swift;
    if (r.error !== undefined) entry.error = r.error;
    else {
      entry.text = r.text;
      if (tok) entry.ids = tok.encode(r.text, { add_special_tokens: false }).ids;
    }
    return entry;
  });
  const golden = { generator, template: `tests/data/chat/templates/${t.template}`, template_source: t.source,
    source_date_epoch: sourceDateEpoch, specials: t.specials, specials_source: t.specials_from, tokenizer: t.tokenizer, cases: out };
  const file = path.join(dataDir, `golden-jinja-${name}.json`);
  fs.writeFileSync(file, JSON.stringify(golden, null, 1) + "\n");
  const errors = out.filter((c) => c.error !== undefined).length;
  console.log(`wrote ${path.relative(root, file)}: ${out.length} cases, ${errors} refused`);
}

function renderSource(source, vars) {
  let compiled;
  try {
    compiled = new Template(source);
  } catch (e) {
    return { error: String(e.message ?? e) };
  }
  return render(compiled, vars);
}
const snip = snippets.map((s) => ({ template: s, ...renderSource(s, snippetVars) }));
fs.writeFileSync(path.join(dataDir, "golden-jinja-snippets.json"),
  JSON.stringify({ generator, vars: snippetVars, snippets: snip }, null, 1) + "\n");
console.log(`wrote tests/data/chat/golden-jinja-snippets.json: ${snip.length} snippets`);
