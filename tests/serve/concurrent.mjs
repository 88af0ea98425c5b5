// N concurrent streaming clients with different prompts, lengths and models
// (the base and each LoRA adapter of --adapters, in turn) each get exactly
// the greedy continuation `whale generate` gives alone (with --adapters for
// an adapter's), while the server batches them (the metrics show more than
// one sequence per forward) and counts each model's requests. With more
// clients than slots the rest wait in the queue; prompts of one model
// sharing a prefix (the template's system turn, "Request 1" and
// "Request 10") reuse cached cells, copied between slots.
import { env, check, finish, call, metric, whale } from './lib.mjs';

const N = Number(process.argv[2] ?? 8);
const models = [{ name: env.model, dir: null }, ...env.adapters];
const prompts = Array.from({ length: N }, (_, i) =>
  `Request ${i}: ` + 'tell me about whales and the sea '.repeat(1 + (i % 4)).slice(0, 20 + 13 * i));
const lengths = prompts.map((_, i) => 12 + 3 * (i % 5));
const modelOf = (i) => models[i % models.length];
const messagesOf = (i) => [{ role: 'user', content: prompts[i] }];

async function streamOne(i) {
  const r = await fetch(env.url + '/v1/chat/completions', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${env.key}` },
    body: JSON.stringify({ model: modelOf(i).name, messages: messagesOf(i), stream: true, max_tokens: lengths[i],
      temperature: 0, ignore_eos: true, skip_special_tokens: false }),
  });
  const text = await r.text();
  let out = '', done = false, model = '';
  for (const ev of text.split('\n\n')) {
    if (!ev.startsWith('data: ')) continue;
    if (ev === 'data: [DONE]') { done = true; continue; }
    const c = JSON.parse(ev.slice(6));
    out += c.choices[0]?.delta?.content ?? '';
    model = c.model;
  }
  return { status: r.status, out, done, model };
}

// What whale generate continues stream i's rendered prompt with, alone,
// greedy, with the stream's adapter.
async function generateAlone(i) {
  const ids = (await call('/tokenize', { messages: messagesOf(i) })).json.tokens;
  const m = modelOf(i);
  const args = ['generate', '-m', env.dir, ...(m.dir ? ['--adapters', m.dir] : []), '--ids', ids.join(','),
                '-n', String(lengths[i]), '--temperature', '0', '--ignore-eos'];
  const out = whale(...args).trim().split(',').map(Number);
  return (await call('/detokenize', { tokens: out })).json.prompt;
}

const listed = (await call('/v1/models')).json.data.map((m) => m.id);
check('/v1/models lists the base, then each adapter', JSON.stringify(listed) === JSON.stringify(models.map((m) => m.name)),
      JSON.stringify(listed));
const want = [];
for (let i = 0; i < N; i++) want.push(await generateAlone(i));
const distinct = new Set(want).size;
check('alone: the prompts give different replies', distinct > N / 2, distinct);
if (models.length > 1) { // the same prompt under each model: every adapter changes the reply
  const ids = (await call('/tokenize', { messages: messagesOf(0) })).json.tokens;
  const replies = models.map((m) => whale('generate', '-m', env.dir, ...(m.dir ? ['--adapters', m.dir] : []),
                                          '--ids', ids.join(','), '-n', '8', '--temperature', '0', '--ignore-eos'));
  check('alone: every adapter changes the greedy reply', new Set(replies).size === models.length,
        JSON.stringify(replies));
}

const maxBefore = await metric('whale_batch_sequences_max');
// the /metrics families the streams must move: requests, tokens, latencies, forwards
const counted = ['whale_requests_total\\{endpoint="chat_completions"\\}', 'whale_generated_tokens_total',
  'whale_time_to_first_token_seconds_count', 'whale_request_seconds_count', 'whale_batch_sequences_per_step_count',
  'whale_decode_steps_total', 'whale_step_phase_seconds_total\\{phase="forward"\\}',
  'whale_step_phase_seconds_total\\{phase="sampling"\\}', 'whale_step_phase_seconds_total\\{phase="publishing"\\}',
  'whale_step_seconds_sum'];
const countedBefore = await Promise.all(counted.map((n) => metric(n)));
const reqBefore = await Promise.all(models.map((m) => metric(`whale_model_requests_total\\{model="${m.name}"\\}`)));
const together = await Promise.all(prompts.map((_, i) => streamOne(i)));
for (let i = 0; i < N; i++)
  check(`together: stream ${i} (${modelOf(i).name}) equals whale generate's reply alone`,
        together[i].out === want[i] && together[i].done && together[i].model === modelOf(i).name,
        JSON.stringify([together[i].out, want[i], together[i].model]));
const maxAfter = await metric('whale_batch_sequences_max');
check('the server batched them (more than one sequence per forward)', maxAfter > 1, `${maxBefore} -> ${maxAfter}`);
check('cached prompt prefixes were reused', (await metric('whale_prompt_tokens_reused_total')) > 0);
const countedAfter = await Promise.all(counted.map((n) => metric(n)));
const delta = countedAfter.map((v, k) => v - countedBefore[k]);
check('/metrics: N more chat requests, their tokens, times to first token and request times',
      delta[0] === N && delta[1] === lengths.reduce((a, b) => a + b, 0) && delta[2] === N && delta[3] === N,
      JSON.stringify(delta));
check('/metrics: one batch-size observation per forward, fewer forwards than tokens (batched)',
      delta[4] === delta[5] && delta[5] > 0 && delta[5] < delta[1], JSON.stringify(delta));
// the phases are parts of each step: every one moved, and they add up to no more than the steps' time
check('/metrics: forward, sampling and publishing time of the steps, within the steps\' time',
      delta[6] > 0 && delta[7] > 0 && delta[8] > 0 && delta[6] + delta[7] + delta[8] <= delta[9] + 1e-5, // sum: to 1 us
      JSON.stringify(delta.slice(6)));
check('/metrics: the queue depth and busy slots are gauges, 0 when idle',
      (await metric('whale_queue_depth')) === 0 && /^# TYPE whale_queue_depth gauge$/m.test((await call('/metrics')).text));
for (let k = 0; k < models.length; k++) {
  const n = await metric(`whale_model_requests_total\\{model="${models[k].name}"\\}`);
  const expect = prompts.filter((_, i) => i % models.length === k).length;
  check(`/metrics counts ${models[k].name}'s requests`, n - reqBefore[k] === expect, `${reqBefore[k]} -> ${n}`);
}
const busy = await metric('whale_slots_busy');
check('every slot is free again', busy === 0, busy);
const h = await call('/health', undefined, { headers: {} });
check('/health without a key: 200 with the KV memory', h.status === 200 && h.json.kv_cache_bytes > 0, h.text);
const page = await call('/', undefined, { headers: {} });
check('GET /: the chat page, without a key, loading nothing from elsewhere',
      page.status === 200 && page.headers.get('content-type').startsWith('text/html') &&
      page.text.includes('/v1/chat/completions') && !/(src|href)="?(https?:)?\/\//.test(page.text));
finish('serve-concurrent');
