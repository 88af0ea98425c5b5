// whale serve's --dtype, --chat-template and --host reach the requests: a
// server started with another precision than the checkpoint's and another
// template than the folder's (on an explicit --host 127.0.0.1) says which in
// /health, renders messages as `whale chat-template --chat-template` does,
// and replies greedily as `whale generate --dtype` does.
// env: SERVE_OPT_URL, that server; SERVE_OPT_DTYPE and SERVE_OPT_TEMPLATE,
// its --dtype and --chat-template; SERVE_URL, a server of the same folder
// with neither.
import fs from 'node:fs';
import { env, check, finish, call, whale } from './lib.mjs';

const url = process.env.SERVE_OPT_URL, dtype = process.env.SERVE_OPT_DTYPE, template = process.env.SERVE_OPT_TEMPLATE;

const h = (await call('/health', undefined, { url, headers: {} })).json;
const h0 = (await call('/health', undefined, { headers: {} })).json;
check('/health names --dtype', h?.dtype?.toLowerCase() === dtype && h.model === env.model, JSON.stringify(h));
check('/health of the server without --dtype names another (the checkpoint\'s)', h0?.dtype && h0.dtype.toLowerCase() !== dtype,
      JSON.stringify(h0));

// no system turn: Qwen2.5's template adds its own, the folder's (Qwen3's) none
const messages = [{ role: 'user', content: 'Where do whales sleep?' }];
fs.writeFileSync(`${env.tmp}/options-messages.json`, JSON.stringify(messages));
const rendered = JSON.parse(whale('chat-template', '-m', env.dir, '--messages', `${env.tmp}/options-messages.json`,
                                  '--chat-template', template, '--add-generation-prompt', '--ids'));
const ids = (await call('/tokenize', { messages }, { url })).json?.tokens;
const ids0 = (await call('/tokenize', { messages })).json?.tokens;
check('/tokenize renders with --chat-template as whale chat-template --chat-template does',
      JSON.stringify(ids) === JSON.stringify(rendered), JSON.stringify([ids?.slice(0, 12), rendered.slice(0, 12)]));
check('the folder\'s own template renders other ids', JSON.stringify(ids0) !== JSON.stringify(rendered));

const n = 12;
const r = await call('/v1/chat/completions', { model: env.model, messages, max_tokens: n, temperature: 0, ignore_eos: true,
                                               skip_special_tokens: false }, { url });
const want = whale('generate', '-m', env.dir, '--dtype', dtype, '--ids', rendered.join(','), '-n', String(n),
                   '--temperature', '0', '--ignore-eos').trim().split(',').map(Number);
const wantText = (await call('/detokenize', { tokens: want }, { url })).json?.prompt;
check('the greedy reply equals whale generate --dtype\'s for the rendered ids',
      r.status === 200 && r.json.choices[0].message.content === wantText && r.json.usage.prompt_tokens === rendered.length,
      JSON.stringify([r.json?.choices?.[0]?.message?.content, wantText]));
// the same ids' first token through the server without --dtype: another
// precision shows in its logprob (the greedy ids above need not differ)
const first = async (u) => (await call('/v1/completions', { model: env.model, prompt: rendered, max_tokens: 1,
                                                            temperature: 0, logprobs: 1 }, { url: u })).json;
const [f, f0] = [await first(url), await first(env.url)];
const lp = f?.choices?.[0]?.logprobs?.token_logprobs?.[0], lp0 = f0?.choices?.[0]?.logprobs?.token_logprobs?.[0];
check(`the first token's logprob in ${dtype} differs from the checkpoint precision's`,
      f.choices[0].text === f0.choices[0].text && Number.isFinite(lp) && Number.isFinite(lp0) && lp !== lp0,
      JSON.stringify([lp, lp0]));

// --stream-interval: a streamed reply's text wakes its connection every
// interval-th token, so the same greedy tokens come in fewer events
const interval = Number(process.env.SERVE_OPT_INTERVAL), m = 24;
const body = { model: env.model, messages, max_tokens: m, temperature: 0, ignore_eos: true, logprobs: true };
const whole = (await call('/v1/chat/completions', body, { url })).json;
const streamed = await call('/v1/chat/completions', { ...body, stream: true }, { url });
const events = streamed.text.split('\n\n').filter((e) => e.startsWith('data: {')).map((e) => JSON.parse(e.slice(6)));
const counts = events.map((e) => e.choices?.[0]?.logprobs?.content?.length ?? 0).filter((k) => k > 0);
check(`--stream-interval ${interval}: the streamed text is the whole reply's`,
      streamed.status === 200 && events.map((e) => e.choices?.[0]?.delta?.content ?? '').join('') ===
        whole?.choices?.[0]?.message?.content, streamed.text.slice(0, 300));
check(`--stream-interval ${interval}: each token's logprob once`, counts.reduce((a, k) => a + k, 0) === m,
      JSON.stringify(counts));
check(`--stream-interval ${interval}: ${m} tokens in at most ${m / 2} events`, counts.length <= m / 2, JSON.stringify(counts));
finish('serve-options');
