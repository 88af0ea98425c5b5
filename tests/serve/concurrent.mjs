// N concurrent streaming clients with different prompts and lengths each get
// exactly the greedy continuation they get alone, while the server batches
// them (the metrics show more than one sequence per forward). With more
// clients than slots the rest wait in the queue; prompts sharing a prefix
// ("Request 1", "Request 10") reuse cached cells, copied between slots.
import { env, check, finish, call, metric } from './lib.mjs';

const N = Number(process.argv[2] ?? 8);
const prompts = Array.from({ length: N }, (_, i) =>
  `Request ${i}: ` + 'tell me about whales and the sea '.repeat(1 + (i % 4)).slice(0, 20 + 13 * i));
const lengths = prompts.map((_, i) => 12 + 3 * (i % 5));

async function streamOne(i) {
  const r = await fetch(env.url + '/v1/chat/completions', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${env.key}` },
    body: JSON.stringify({ model: env.model, messages: [{ role: 'user', content: prompts[i] }], stream: true,
      max_tokens: lengths[i], temperature: 0, ignore_eos: true }),
  });
  const text = await r.text();
  let out = '', done = false;
  for (const ev of text.split('\n\n')) {
    if (!ev.startsWith('data: ')) continue;
    if (ev === 'data: [DONE]') { done = true; continue; }
    const c = JSON.parse(ev.slice(6));
    out += c.choices[0]?.delta?.content ?? '';
  }
  return { status: r.status, out, done };
}

const alone = [];
for (let i = 0; i < N; i++) alone.push(await streamOne(i));
check('alone: every stream ends with [DONE]', alone.every((a) => a.status === 200 && a.done));
const distinct = new Set(alone.map((a) => a.out)).size;
check('alone: the prompts give different replies', distinct > N / 2, distinct);

const maxBefore = await metric('whale_batch_sequences_max');
const together = await Promise.all(prompts.map((_, i) => streamOne(i)));
for (let i = 0; i < N; i++)
  check(`together: stream ${i} equals its reply alone`, together[i].out === alone[i].out && together[i].done,
        JSON.stringify([together[i].out, alone[i].out]));
const maxAfter = await metric('whale_batch_sequences_max');
check('the server batched them (more than one sequence per forward)', maxAfter > 1, `${maxBefore} -> ${maxAfter}`);
check('cached prompt prefixes were reused', (await metric('whale_prompt_tokens_reused_total')) > 0);
const busy = await metric('whale_slots_busy');
check('every slot is free again', busy === 0, busy);
const h = await call('/health', undefined, { headers: {} });
check('/health without a key: 200 with the KV memory', h.status === 200 && h.json.kv_cache_bytes > 0, h.text);
const page = await call('/', undefined, { headers: {} });
check('GET /: the chat page, without a key, loading nothing from elsewhere',
      page.status === 200 && page.headers.get('content-type').startsWith('text/html') &&
      page.text.includes('/v1/chat/completions') && !/(src|href)="?(https?:)?\/\//.test(page.text));
finish('serve-concurrent');
