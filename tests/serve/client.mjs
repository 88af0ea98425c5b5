// The official OpenAI client drives whale serve: chat (whole and streamed),
// completions, models, errors; greedy replies equal `whale generate`'s.
import fs from 'node:fs';
import OpenAI from 'openai';
import { env, check, finish, whale, call } from './lib.mjs';

const client = new OpenAI({ baseURL: env.url + '/v1', apiKey: env.key, maxRetries: 0 });

// What `whale generate` continues a prompt of ids with, greedy, as text.
function generateText(ids, n) {
  const out = whale('generate', '-m', env.dir, '--ids', ids.join(','), '-n', String(n), '--temperature', '0',
                    '--ignore-eos').trim();
  return whale('detokenize', '-m', env.dir, '--ids', out);
}

function chatIds(messages) {
  const f = `${env.tmp}/messages.json`;
  fs.writeFileSync(f, JSON.stringify(messages));
  return JSON.parse(whale('chat-template', '-m', env.dir, '--messages', f, '--add-generation-prompt', '--ids'));
}

const greedy = { temperature: 0, ignore_eos: true, skip_special_tokens: false };

// models
const models = await client.models.list();
check('models: the served name, then its adapters', models.data.length === 1 + env.adapters.length &&
      models.data[0].id === env.model && env.adapters.every((a, k) => models.data[k + 1].id === a.name &&
      models.data[k + 1].parent === env.model), JSON.stringify(models.data));

// chat, whole: the reply equals whale generate's on the rendered prompt
const messages = [{ role: 'system', content: 'You are a test.' }, { role: 'user', content: 'Hello there' }];
const ids = chatIds(messages);
const want = generateText(ids, 12);
const r = await client.chat.completions.create({ model: env.model, messages, max_tokens: 12, ...greedy });
check('chat: object and role', r.object === 'chat.completion' && r.choices[0].message.role === 'assistant');
check('chat: greedy reply equals whale generate', r.choices[0].message.content === want,
      JSON.stringify([r.choices[0].message.content, want]));
check('chat: finish_reason length', r.choices[0].finish_reason === 'length', r.choices[0].finish_reason);
check('chat: usage counts the rendered prompt', r.usage.prompt_tokens === ids.length &&
      r.usage.completion_tokens === 12 && r.usage.total_tokens === ids.length + 12, JSON.stringify(r.usage));

// chat, streamed: the same text, usage in the last chunk
const stream = await client.chat.completions.create({ model: env.model, messages, max_tokens: 12, stream: true,
  stream_options: { include_usage: true }, ...greedy });
let text = '', finishReason = null, usage = null, chunks = 0, role = null;
for await (const c of stream) {
  chunks++;
  if (c.usage) usage = c.usage;
  if (!c.choices.length) continue;
  if (c.choices[0].delta.role) role = c.choices[0].delta.role;
  text += c.choices[0].delta.content ?? '';
  if (c.choices[0].finish_reason) finishReason = c.choices[0].finish_reason;
}
check('stream: the same reply as the whole one', text === want, JSON.stringify([text, want]));
check('stream: role, finish_reason and usage', role === 'assistant' && finishReason === 'length' &&
      usage && usage.completion_tokens === 12, JSON.stringify({ role, finishReason, usage }));
check('stream: several chunks', chunks > 3, chunks);
check('stream: the second request reused the prompt\'s cells', usage.prompt_tokens_details.cached_tokens > 0,
      JSON.stringify(usage));

// completions: a string prompt and an id prompt
const prompt = 'Once upon a time';
const pids = whale('tokenize', '-m', env.dir, prompt).trim().split(',').map(Number);
const tk = await call('/tokenize', { prompt });
check('/tokenize: whale tokenize\'s ids, their count and the context', tk.status === 200 &&
      JSON.stringify(tk.json.tokens) === JSON.stringify(pids) && tk.json.count === pids.length &&
      tk.json.max_model_len > 0, tk.text);
const dt = await call('/detokenize', { tokens: pids });
check('/detokenize: the prompt again', dt.status === 200 && dt.json.prompt === prompt, dt.text);
const c1 = await client.completions.create({ model: env.model, prompt, max_tokens: 10, ...greedy });
check('completions: greedy text equals whale generate', c1.choices[0].text === generateText(pids, 10),
      JSON.stringify(c1.choices[0].text));
const c2 = await client.completions.create({ model: env.model, prompt: pids, max_tokens: 10, ...greedy });
check('completions: an id prompt gives the same text', c2.choices[0].text === c1.choices[0].text);
const c3 = await client.completions.create({ model: env.model, prompt, max_tokens: 10, echo: true, ...greedy });
check('completions: echo puts the prompt first', c3.choices[0].text === prompt + c1.choices[0].text);
let streamed = '';
for await (const c of await client.completions.create({ model: env.model, prompt, max_tokens: 10, stream: true,
  ...greedy }))
  streamed += c.choices[0]?.text ?? '';
check('completions: streamed text equals the whole', streamed === c1.choices[0].text);

// stop strings: the reply ends before the first one, which is not sent
const full = c1.choices[0].text;
const cut = [...full].slice(2, 4).join('');
if (cut.length) {
  const c4 = await client.completions.create({ model: env.model, prompt, max_tokens: 10, stop: [cut], ...greedy });
  check('stop: the text ends before the stop string', c4.choices[0].text === full.slice(0, full.indexOf(cut)) &&
        c4.choices[0].finish_reason === 'stop', JSON.stringify([c4.choices[0].text, cut, full]));
  let s = '';
  for await (const c of await client.completions.create({ model: env.model, prompt, max_tokens: 10, stop: cut,
    stream: true, ...greedy }))
    s += c.choices[0]?.text ?? '';
  check('stop: streamed, the same', s === full.slice(0, full.indexOf(cut)), JSON.stringify(s));
}

// sampling: a seed gives the same reply twice; penalties and filters are accepted
const sampled = { model: env.model, messages, max_tokens: 8, temperature: 0.9, top_p: 0.95, top_k: 40, min_p: 0.01,
  seed: 7, frequency_penalty: 0.5, presence_penalty: 0.3, repetition_penalty: 1.1 };
const s1 = await client.chat.completions.create(sampled), s2 = await client.chat.completions.create(sampled);
check('seed: equal replies', s1.choices[0].message.content === s2.choices[0].message.content);

// max_completion_tokens, the newer name of max_tokens
const mc = await client.chat.completions.create({ model: env.model, messages, max_completion_tokens: 3, ...greedy });
check('max_completion_tokens: 3 tokens, finish_reason length', mc.usage.completion_tokens === 3 &&
      mc.choices[0].finish_reason === 'length', JSON.stringify(mc.usage));

// errors come back as OpenAI's error objects, which the client raises
async function rejects(what, fn, status, param) {
  try {
    await fn();
    check(what, false, 'no error');
  } catch (e) {
    check(what, e instanceof OpenAI.APIError && e.status === status && (!param || e.param === param) &&
          typeof e.message === 'string', `${e.status} ${e.param} ${e.message}`);
  }
}
await rejects('unknown model: 404', () => client.chat.completions.create({ model: 'nope', messages }), 404, 'model');
await rejects('n = 2: 400', () => client.chat.completions.create({ model: env.model, messages, n: 2 }), 400, 'n');
await rejects('temperature 5: 400', () => client.chat.completions.create({ model: env.model, messages,
  temperature: 5 }), 400, 'temperature');
await rejects('empty messages: 400', () => client.chat.completions.create({ model: env.model, messages: [] }), 400,
  'messages');
const bad = new OpenAI({ baseURL: env.url + '/v1', apiKey: 'wrong', maxRetries: 0 });
await rejects('wrong API key: 401', () => bad.models.list(), 401);

finish('serve-client');
