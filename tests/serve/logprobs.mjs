// logprobs / top_logprobs through the official OpenAI client, checked against
// an independent computation: `whale score --logits-out` runs the whole
// sequence (prompt + the greedy reply of `whale generate`) through the model
// in one forward without a KV cache, and the log-softmax of its logits rows
// is computed here in double. The server reports the raw distribution
// (before penalties and temperature), so a sampled request with a repetition
// penalty shows the same numbers for its first token.
import fs from 'node:fs';
import OpenAI from 'openai';
import { env, check, finish, whale, call } from './lib.mjs';

const client = new OpenAI({ baseURL: env.url + '/v1', apiKey: env.key, maxRetries: 0 });
const greedy = { temperature: 0, ignore_eos: true, skip_special_tokens: false };
const TOL = 1e-4; // fp32: the batched KV-cache decode and the whole forward agree far closer

// rows[i] = log-softmax of the logits predicting position i + 1
function referenceLogprobs(ids) {
  const f = `${env.tmp}/lp-ids.json`, out = `${env.tmp}/lp-logits.safetensors`;
  fs.writeFileSync(f, JSON.stringify([ids]));
  whale('score', '-m', env.dir, '--ids', f, '--logits-out', out);
  const buf = fs.readFileSync(out), n = Number(buf.readBigUInt64LE(0));
  const meta = JSON.parse(buf.subarray(8, 8 + n).toString()).logits;
  const [, S, V] = meta.shape, base = 8 + n + meta.data_offsets[0];
  const logits = new Float32Array(buf.buffer.slice(buf.byteOffset + base, buf.byteOffset + base + S * V * 4));
  const rows = [];
  for (let s = 0; s < S; s++) {
    const row = logits.subarray(s * V, (s + 1) * V);
    let mx = -Infinity, sum = 0;
    for (const x of row) mx = Math.max(mx, x);
    for (const x of row) sum += Math.exp(x - mx);
    const lse = mx + Math.log(sum);
    rows.push(Float64Array.from(row, (x) => x - lse));
  }
  return rows;
}
// the logits predicting the token after ids
function lastLogits(ids) {
  const f = `${env.tmp}/lp-ids.json`, out = `${env.tmp}/lp-logits.safetensors`;
  fs.writeFileSync(f, JSON.stringify([ids]));
  whale('score', '-m', env.dir, '--ids', f, '--logits-out', out);
  const buf = fs.readFileSync(out), n = Number(buf.readBigUInt64LE(0));
  const meta = JSON.parse(buf.subarray(8, 8 + n).toString()).logits;
  const [, S, V] = meta.shape, base = 8 + n + meta.data_offsets[0] + (S - 1) * V * 4;
  return new Float32Array(buf.buffer.slice(buf.byteOffset + base, buf.byteOffset + base + V * 4));
}
const topValues = (row, k) => Array.from(row).sort((a, b) => b - a).slice(0, k);
const close = (a, b) => a.length === b.length && a.every((x, i) => Math.abs(x - b[i]) < TOL);

function chatIds(messages) {
  const f = `${env.tmp}/lp-messages.json`;
  fs.writeFileSync(f, JSON.stringify(messages));
  return JSON.parse(whale('chat-template', '-m', env.dir, '--messages', f, '--add-generation-prompt', '--ids'));
}
const generate = (ids, n) => whale('generate', '-m', env.dir, '--ids', ids.join(','), '-n', String(n),
  '--temperature', '0', '--ignore-eos').trim().split(',').map(Number);

// chat, whole: each token's logprob and its 5 alternatives equal the reference
const messages = [{ role: 'user', content: 'Tell me about logprobs' }];
const N = 8, K = 5;
const pids = chatIds(messages), gen = generate(pids, N), ref = referenceLogprobs([...pids, ...gen]);
const at = (i) => ref[pids.length - 1 + i];
const r = await client.chat.completions.create({ model: env.model, messages, max_tokens: N, logprobs: true,
  top_logprobs: K, ...greedy });
const content = r.choices[0].logprobs?.content ?? [];
check('chat logprobs: one entry per token', content.length === N, content.length);
check('chat logprobs: equal the log-softmax of whale score\'s logits',
      content.length === N && content.every((t, i) => Math.abs(t.logprob - at(i)[gen[i]]) < TOL),
      JSON.stringify(content.map((t, i) => [t.logprob, at(i)[gen[i]]])));
check('chat top_logprobs: the 5 most probable, in order, equal the reference',
      content.every((t, i) => t.top_logprobs.length === K && close(t.top_logprobs.map((a) => a.logprob),
                                                                      topValues(at(i), K))),
      JSON.stringify(content[0]?.top_logprobs));
check('chat logprobs: the greedy token is the first alternative',
      content.every((t) => t.top_logprobs[0].token === t.token && t.top_logprobs[0].logprob === t.logprob));
check('chat logprobs: tokens and bytes spell the reply', content.map((t) => t.token).join('') ===
      r.choices[0].message.content && Buffer.from(content.flatMap((t) => t.bytes)).toString() ===
      r.choices[0].message.content, JSON.stringify(content.map((t) => t.token)));
const single = whale('detokenize', '-m', env.dir, '--ids', String(gen[0]));
check('chat logprobs: a token\'s text is the tokenizer\'s', single.includes('\uFFFD') || content[0]?.token === single,
      JSON.stringify([content[0]?.token, single]));

// streamed: the same entries, spread over the chunks
const stream = await client.chat.completions.create({ model: env.model, messages, max_tokens: N, logprobs: true,
  top_logprobs: K, stream: true, ...greedy });
const streamed = [];
let chunksWith = 0;
for await (const c of stream) {
  const lp = c.choices[0]?.logprobs?.content;
  if (lp?.length) chunksWith++, streamed.push(...lp);
}
// (to float rounding: the second request reuses the prompt's cached cells, so its last prompt token is
// computed in another batch)
const same = (a, b) => a.length === b.length && a.every((t, i) => t.token === b[i].token &&
  Math.abs(t.logprob - b[i].logprob) < TOL && t.top_logprobs.map((x) => x.token).join('\0') ===
  b[i].top_logprobs.map((x) => x.token).join('\0'));
check('streamed logprobs: equal the whole reply\'s', same(streamed, content),
      JSON.stringify([streamed.map((t) => t.logprob), content.map((t) => t.logprob)]));
check('streamed logprobs: in several chunks', chunksWith > 1, chunksWith);

// completions: the legacy shape, over an id prompt
const c = await client.completions.create({ model: env.model, prompt: pids, max_tokens: N, logprobs: 3, ...greedy });
const lp = c.choices[0].logprobs;
check('completions logprobs: token_logprobs equal the reference',
      lp && lp.token_logprobs.length === N && lp.token_logprobs.every((x, i) => Math.abs(x - at(i)[gen[i]]) < TOL),
      JSON.stringify(lp));
check('completions logprobs: tokens spell the text, text_offset counts them',
      lp && lp.tokens.join('') === c.choices[0].text &&
      lp.text_offset.every((o, i) => o === [...lp.tokens.slice(0, i).join('')].length), JSON.stringify(lp?.text_offset));
check('completions logprobs: up to 3 alternatives per token, the reference\'s values',
      lp && lp.top_logprobs.every((d, i) => Object.keys(d).length >= 1 && Object.keys(d).length <= 3 &&
        Object.values(d).every((x) => topValues(at(i), 3).some((y) => Math.abs(x - y) < TOL))));
let sc = [];
for await (const ch of await client.completions.create({ model: env.model, prompt: pids, max_tokens: N, logprobs: 3,
  stream: true, ...greedy }))
  sc.push(...(ch.choices[0]?.logprobs?.token_logprobs ?? []));
check('completions logprobs streamed: the same values', sc.length === N && sc.every((x, i) =>
      Math.abs(x - lp.token_logprobs[i]) < TOL), JSON.stringify(sc));

// the raw distribution: temperature and a repetition penalty do not change the numbers
const s = await client.completions.create({ model: env.model, prompt: pids, max_tokens: 1, logprobs: 20,
  temperature: 1.5, repetition_penalty: 1.5, seed: 3 });
const first = Object.values(s.choices[0].logprobs.top_logprobs[0]).sort((a, b) => b - a);
const want = topValues(at(0), 20);
check('sampled with a penalty: the top 20 are the model\'s own log-softmax',
      first.length >= 18 && first.every((x) => want.some((y) => Math.abs(x - y) < TOL)), JSON.stringify(first));

// a reply cut by a stop string reports the tokens of the text it returns
const full = r.choices[0].message.content, cut = [...full].slice(3, 5).join('');
if (cut.length && full.indexOf(cut) > 0) {
  const st = await client.chat.completions.create({ model: env.model, messages, max_tokens: N, logprobs: true,
    stop: [cut], ...greedy });
  const toks = st.choices[0].logprobs.content.map((t) => t.token).join('');
  check('stop string: the logprobs cover the returned text', toks.startsWith(st.choices[0].message.content) &&
        toks.length < full.length + 1 && st.choices[0].finish_reason === 'stop', JSON.stringify([toks, full, cut]));
}

// Let the client see the connections the server closed while a computation here blocked the event loop.
const idle = () => new Promise((r) => setTimeout(r, 100));

// OpenAI's frequency and presence penalties, greedy: each reply token is the argmax of the model's row less
// frequency × its count in the reply so far + presence × (count > 0) — replayed here from whale score's rows
// of the growing sequence
// (negative penalties, which favour repeats, change this random model's choices within a few tokens)
for (const [fp, pp] of [[2.0, 0.5], [-1.5, -0.5]]) {
  const M = 8, ids = [...pids], counts = new Map();
  let changed = 0;
  for (let i = 0; i < M; i++) {
    const row = lastLogits(ids);
    let best = -1, bestV = -Infinity, raw = -1, rawV = -Infinity;
    for (let v = 0; v < row.length; v++) {
      const c = counts.get(v) ?? 0, x = row[v] - fp * c - (c > 0 ? pp : 0);
      if (x > bestV) best = v, bestV = x;
      if (row[v] > rawV) raw = v, rawV = row[v];
    }
    changed += best !== raw;
    counts.set(best, (counts.get(best) ?? 0) + 1);
    ids.push(best);
  }
  const want = whale('detokenize', '-m', env.dir, '--ids', ids.slice(pids.length).join(','));
  await idle(); // the replay blocked the event loop for longer than the server keeps an idle connection
  const got = await client.completions.create({ model: env.model, prompt: pids, max_tokens: M, frequency_penalty: fp,
    presence_penalty: pp, ...greedy });
  check(`penalties ${fp}, ${pp}: the greedy reply is the penalised argmax at every token`, got.choices[0].text === want,
        JSON.stringify([got.choices[0].text, want]));
  if (fp < 0) check('negative penalties changed the choice at some token (the test sees them)', changed > 0, changed);
}

// the extensions reach the sampler: top_k 1 and min_p 0.999 leave only the most probable token, so a hot sampled
// request gives the greedy reply; repetition_penalty gives whale generate's reply with the same penalty (below 1,
// which favours the tokens seen, so that it changes this model's reply)
{
  const M = 10, hot = { temperature: 1.8, seed: 11, ignore_eos: true, skip_special_tokens: false };
  const greedyText = whale('detokenize', '-m', env.dir, '--ids', generate(pids, M).join(','));
  const rp = whale('generate', '-m', env.dir, '--ids', pids.join(','), '-n', String(M), '--temperature', '0',
    '--ignore-eos', '--repeat-penalty', '0.4').trim();
  const want = whale('detokenize', '-m', env.dir, '--ids', rp);
  await idle();
  for (const f of [{ top_k: 1 }, { min_p: 0.999 }]) {
    const got = await client.completions.create({ model: env.model, prompt: pids, max_tokens: M, ...hot, ...f });
    check(`${JSON.stringify(f)}: a sampled reply is the greedy one`, got.choices[0].text === greedyText,
          JSON.stringify([got.choices[0].text, greedyText]));
  }
  const free = await client.completions.create({ model: env.model, prompt: pids, max_tokens: M, ...hot });
  check('without them the same sampled request differs (the test sees the filters)',
        free.choices[0].text !== greedyText, JSON.stringify(free.choices[0].text));
  const got = await client.completions.create({ model: env.model, prompt: pids, max_tokens: M, repetition_penalty: 0.4,
    ...greedy });
  check('repetition_penalty: whale generate\'s greedy reply with --repeat-penalty', got.choices[0].text === want &&
        want !== greedyText, JSON.stringify([got.choices[0].text, want]));
}

// validation: 400 naming the field
async function bad(what, path, body, param) {
  const res = await call(path, { model: env.model, max_tokens: 2, ...body });
  check(what, res.status === 400 && res.json?.error?.param === param, `${res.status} ${res.text.slice(0, 200)}`);
}
await bad('top_logprobs 21: 400', '/v1/chat/completions', { messages, logprobs: true, top_logprobs: 21 }, 'top_logprobs');
await bad('top_logprobs -1: 400', '/v1/chat/completions', { messages, logprobs: true, top_logprobs: -1 }, 'top_logprobs');
await bad('top_logprobs without logprobs: 400', '/v1/chat/completions', { messages, top_logprobs: 2 }, 'top_logprobs');
await bad('chat logprobs a number: 400', '/v1/chat/completions', { messages, logprobs: 3 }, 'logprobs');
await bad('completions logprobs a boolean: 400', '/v1/completions', { prompt: 'x', logprobs: true }, 'logprobs');
await bad('completions logprobs 21: 400', '/v1/completions', { prompt: 'x', logprobs: 21 }, 'logprobs');
await bad('completions logprobs with echo: 400', '/v1/completions', { prompt: 'x', logprobs: 1, echo: true }, 'logprobs');
const off = await call('/v1/chat/completions', { model: env.model, messages, max_tokens: 2, logprobs: false });
check('logprobs false: null', off.status === 200 && off.json.choices[0].logprobs === null, off.text.slice(0, 200));

finish('serve-logprobs');
