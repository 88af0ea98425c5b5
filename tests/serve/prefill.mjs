// A long prompt that arrives while a stream is generating is prefilled in
// chunks of the batch's token budget, each next to the running stream's
// decoding, so that stream does not stall until the prompt is done. No
// timing: the server's histogram of sequences per batched forward counts the
// steps that held both requests. The long request asks for one token, so it
// ends in the step that finishes its prefill: every step with two sequences
// is one chunk of its prompt plus one token of the running stream. Prefilled
// in one piece, there would be one such step (or none, before decoding
// resumed).
// env: SERVE_OPT_URL, the server; SERVE_OPT_BATCH, its --batch.
import { env, check, finish, call, metric } from './lib.mjs';

const url = process.env.SERVE_OPT_URL, batch = Number(process.env.SERVE_OPT_BATCH);
const post = (body, signal) => fetch(url + '/v1/completions', {
  method: 'POST', signal,
  headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${env.key}` },
  body: JSON.stringify({ model: env.model, temperature: 0, ignore_eos: true, ...body }),
});
// from one read of /metrics (steps go on between two): the steps with two
// sequences, the prompt tokens admitted and those reused from the cache
async function counts() {
  const text = (await call('/metrics', undefined, { url })).text;
  const get = (name) => Number(text.match(new RegExp(`^${name} (\\S+)$`, 'm'))?.[1]);
  const bucket = (le) => get(`whale_batch_sequences_per_step_bucket\\{le="${le}"\\}`);
  return { two: bucket(2) - bucket(1), prompt: get('whale_prompt_tokens_total'), reused: get('whale_prompt_tokens_reused_total') };
}

// the running stream: long enough to outlast the long prompt's prefill,
// cancelled once that is done
const abort = new AbortController();
const a = await post({ prompt: 'Whales sing', max_tokens: 900, stream: true }, abort.signal);
const reader = a.body.getReader(), dec = new TextDecoder();
let aText = '';
const aChunks = () => (aText.match(/^data: \{/gm) ?? []).length;
const aEnded = () => /"finish_reason":"/.test(aText);
const reading = (async () => {
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      aText += dec.decode(value, { stream: true });
    }
  } catch { /* aborted */ }
})();
while (aChunks() < 2 && !aEnded()) await new Promise((r) => setTimeout(r, 1));
check('the running stream started', a.status === 200 && aChunks() >= 2, aText.slice(0, 200));

const before = await counts();
const aAtSubmit = aChunks();
// it starts with this run's own number: no slot has its cells cached
const long = `Log ${process.pid}.${Date.now()} of the keeper at Cape Zanzibar: ` +
  'the keeper counts waves, gulls and passing ships. '.repeat(30);
const b = await post({ prompt: long, max_tokens: 1, stream: false });
const bj = await b.json();
const aAtReply = aChunks(), aStillRunning = !aEnded();
const after = await counts();
abort.abort();
await reading;

check('the long request: one token', b.status === 200 && bj.usage?.completion_tokens === 1, JSON.stringify(bj).slice(0, 300));
const computed = (after.prompt - before.prompt) - (after.reused - before.reused); // the long prompt's prefilled tokens
const chunks = Math.ceil(computed / (batch - 1)); // each step: the stream's token, then batch - 1 prompt tokens
check('the long prompt needs several chunks', computed === bj.usage?.prompt_tokens - (after.reused - before.reused) &&
      chunks >= 4, JSON.stringify({ computed, batch, usage: bj.usage }));
check('the running stream was still generating when the long reply came', aStillRunning && aAtReply > aAtSubmit,
      JSON.stringify({ aAtSubmit, aAtReply }));
check('every chunk of the long prompt shared its forward with the running stream\'s next token',
      after.two - before.two === chunks, JSON.stringify({ steps_with_both: after.two - before.two, chunks }));

for (let i = 0; i < 500 && (await metric('whale_slots_busy', url)) !== 0; i++) await new Promise((r) => setTimeout(r, 10));
check('the cancelled stream freed its slot', (await metric('whale_slots_busy', url)) === 0);
finish('serve-prefill');
