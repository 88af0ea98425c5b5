// Bad and hostile requests: each gets its 4xx (or its connection closed) and
// the server keeps serving. Then a full queue (503), and SIGTERM draining,
// on a second server (SERVE_URL2, SERVE_PID2: --parallel 1 --queue 1).
import { env, check, finish, call, raw, metric, rssKiB, auth } from './lib.mjs';

const messages = [{ role: 'user', content: 'Hi' }];
const chat = (extra) => call('/v1/chat/completions', { model: env.model, messages, max_tokens: 2, ...extra });

async function expectError(what, res, status, param, code) {
  const r = await res;
  const e = r.json?.error;
  check(what, r.status === status && e && typeof e.message === 'string' && 'type' in e && 'param' in e &&
        'code' in e && (param === undefined || e.param === param) && (code === undefined || e.code === code),
        `${r.status} ${r.text.slice(0, 300)}`);
}

// malformed bodies and fields
await expectError('invalid JSON: 400', call('/v1/chat/completions', '{"model": '), 400);
await expectError('a JSON array body: 400', call('/v1/chat/completions', '[1, 2]'), 400);
await expectError('messages not an array: 400', chat({ messages: 'hi' }), 400, 'messages');
await expectError('a message without a role: 400', chat({ messages: [{ content: 'x' }] }), 400, 'messages');
await expectError('an unknown role: 400', chat({ messages: [{ role: 'wizard', content: 'x' }] }), 400, 'messages');
await expectError('an image part: 400', chat({ messages: [{ role: 'user', content: [{ type: 'image_url' }] }] }),
                  400, 'messages');
await expectError('max_tokens a string: 400', chat({ max_tokens: 'ten' }), 400, 'max_tokens');
await expectError('max_tokens 1e12: 400', chat({ max_tokens: 1e12 }), 400, 'max_tokens');
await expectError('max_tokens 0: 400', chat({ max_tokens: 0 }), 400, 'max_tokens');
await expectError('temperature a string: 400', chat({ temperature: 'hot' }), 400, 'temperature');
await expectError('top_p 0: 400', chat({ top_p: 0 }), 400, 'top_p');
await expectError('stream "yes": 400', chat({ stream: 'yes' }), 400, 'stream');
await expectError('stop a number: 400', chat({ stop: 5 }), 400, 'stop');
await expectError('five stop strings: 400', chat({ stop: ['a', 'b', 'c', 'd', 'e'] }), 400, 'stop');
await expectError('logprobs "yes": 400', chat({ logprobs: 'yes' }), 400, 'logprobs');
await expectError('top_logprobs 100: 400', chat({ logprobs: true, top_logprobs: 100 }), 400, 'top_logprobs');
await expectError('no model: 400', call('/v1/chat/completions', { messages }), 400, 'model');
await expectError('unknown model: 404', chat({ model: 'gpt-9' }), 404, 'model', 'model_not_found');
await expectError('a prompt id outside the vocabulary: 400',
                  call('/v1/completions', { model: env.model, prompt: [1, 99999999] }), 400, 'prompt');
await expectError('two prompts: 400', call('/v1/completions', { model: env.model, prompt: ['a', 'b'] }), 400, 'prompt');
await expectError('a prompt longer than the context: 400',
                  call('/v1/completions', { model: env.model, prompt: 'whale '.repeat(2000) }), 400, undefined,
                  'context_length_exceeded');
await expectError('no route: 404', call('/v2/engines'), 404);
await expectError('GET on a POST route: 405', call('/v1/chat/completions', undefined), 405);
await expectError('no API key: 401', call('/v1/models', undefined, { headers: {} }), 401);
await expectError('a key that is a prefix of the right one: 401',
                  call('/v1/models', undefined, { headers: { Authorization: `Bearer ${env.key.slice(0, -1)}` } }), 401);
await expectError('tokenize without text: 400', call('/tokenize', { prompt: 5 }), 400, 'prompt');
await expectError('detokenize a negative id: 400', call('/detokenize', { tokens: [-1] }), 400, 'tokens');

// max_tokens beyond the context is capped by it
const ctx = (await call('/health', undefined, { headers: {} })).json.ctx_size;
const big = await call('/v1/completions', { model: env.model, prompt: 'Hi', max_tokens: 100000, ignore_eos: true,
  temperature: 0 });
check('max_tokens beyond the context: capped, finish_reason length',
      big.status === 200 && big.json.choices[0].finish_reason === 'length' &&
      big.json.usage.prompt_tokens + big.json.usage.completion_tokens === ctx, big.text.slice(0, 300));

// a 100 MB body: 413 from its Content-Length, before it is read
const head = (n) => `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${env.key}\r\n` +
  `Content-Type: application/json\r\nContent-Length: ${n}\r\n\r\n`;
const huge = await raw([head(100 << 20), Buffer.alloc(4 << 20, 0x20)], { gapMs: 500, timeoutMs: 10000 });
check('a 100 MB body: 413', /^HTTP\/1\.1 413/.test(huge.out), huge.out.slice(0, 100));
// a chunked body past the limit: the connection is closed
const chunk = Buffer.alloc(1 << 20, 0x20);
const chunked = await raw([`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${env.key}\r\n` +
  'Transfer-Encoding: chunked\r\n\r\n', ...Array.from({ length: 12 }, () =>
  Buffer.concat([Buffer.from('100000\r\n'), chunk, Buffer.from('\r\n')]))], { timeoutMs: 10000 });
check('a chunked body past --max-body: closed', chunked.closed && !/^HTTP\/1\.1 200/.test(chunked.out));
// a client that disconnects mid-stream cancels its generation and frees its
// slot; so does one that gives up waiting for a whole reply
async function abortedBy(what, send, url = env.url) {
  const before = await metric('whale_requests_aborted_total', url);
  await send();
  let after = before;
  for (let i = 0; i < 100 && !(after > before && (await metric('whale_slots_busy', url)) === 0); i++) {
    await new Promise((r) => setTimeout(r, 100));
    after = await metric('whale_requests_aborted_total', url);
  }
  check(`${what}: cancelled, slot freed`, after === before + 1 && (await metric('whale_slots_busy', url)) === 0,
        `${before} -> ${after}`);
}
// on the server with the longer context (SERVE_PAGE_URL, 2,048 cells) when
// there is one: 1,500 tokens take seconds, so a client slowed down by a busy
// machine still leaves before its reply ends
const longUrl = process.env.SERVE_PAGE_URL ?? env.url, longPort = Number(new URL(longUrl).port);
const longMax = process.env.SERVE_PAGE_URL ? 1500 : 240;
const streamBody = JSON.stringify({ model: env.model, messages, max_tokens: longMax, stream: true, ignore_eos: true });
await abortedBy('disconnect mid-stream', () => raw([head(Buffer.byteLength(streamBody)) + streamBody], {
  port: longPort, timeoutMs: 10000, onData: (out, sock) => { if (out.includes('"content":"')) sock.destroy(); } }),
  longUrl);
const wholeBody = JSON.stringify({ model: env.model, messages, max_tokens: 240, ignore_eos: true });
const whole = await call('/v1/chat/completions', wholeBody);
check('a whole 240-token reply', whole.status === 200 && whole.json?.usage?.completion_tokens === 240,
      whole.text.slice(0, 200));
// a client that gives up waiting for a whole reply: it hangs up once the
// server's metrics show its request running
const longBody = JSON.stringify({ model: env.model, messages, max_tokens: longMax, ignore_eos: true });
await abortedBy('disconnect before a whole reply', () => raw([head(Buffer.byteLength(longBody)) + longBody], {
  port: longPort, timeoutMs: 30000, closeWhen: async () => {
    for (let i = 0; i < 500 && (await metric('whale_slots_busy', longUrl)) !== 1; i++)
      await new Promise((r) => setTimeout(r, 10));
  } }), longUrl);

// many sequential requests: all answered, memory flat (resident set within 16 MiB of what it was after the
// first 100, which warm the allocator and the prefix cache); every kind of reply, logprobs and tools included
const n = env.sanitized ? 200 : 1000;
const kinds = [{}, { logprobs: true, top_logprobs: 5, max_tokens: 2 }, { stream: true, max_tokens: 2 },
  { tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: 'required', max_tokens: 2 }];
let ok = 0, rss0 = 0;
for (let i = 0; i < n; i++) {
  const r = await chat({ max_tokens: 1, messages: [{ role: 'user', content: `Request number ${i}` }],
                         ...kinds[i % 8 < 4 ? i % 8 : 0] });
  ok += r.status === 200;
  if (i === 99) rss0 = rssKiB(env.pid);
}
const rss1 = rssKiB(env.pid);
check(`${n} sequential requests: all 200`, ok === n, ok);
if (!env.sanitized) check(`${n} sequential requests: resident memory flat`, rss1 - rss0 < 16384, `${rss0} -> ${rss1} KiB`);
check('still serving', (await chat({})).status === 200);

// a second server, one slot and a queue of one: the third request gets 503
if (process.env.SERVE_URL2) {
  const url2 = process.env.SERVE_URL2, port2 = Number(new URL(url2).port);
  // headers, or a body, sent one byte a second: cut off after --timeout (3 s on the second server), while
  // another client is served
  const t0 = Date.now();
  const body = JSON.stringify({ model: env.model, messages, max_tokens: 1 });
  const slowBody = raw([head(body.length), ...body.split('')], { gapMs: 1000, timeoutMs: 15000, port: port2 });
  let slowDone = false;
  const slowHead = raw(head(body.length).split(''), { gapMs: 1000, timeoutMs: 15000, port: port2 });
  slowHead.then(() => { slowDone = true; });
  const meanwhile = await fetch(url2 + '/v1/chat/completions', { method: 'POST', headers: auth,
    body: JSON.stringify({ model: env.model, messages, max_tokens: 2 }) });
  check('slow clients: another is served meanwhile', meanwhile.status === 200 && !slowDone,
        `${meanwhile.status} after ${Date.now() - t0} ms`);
  await meanwhile.text();
  // how long the connection may stay idle (the watchdog's --timeout): the
  // client opens a new one for the requests below rather than racing the
  // server's close of this one
  check('responses give the idle limit', meanwhile.headers.get('keep-alive') === 'timeout=3',
        meanwhile.headers.get('keep-alive'));
  const [sb, h] = [await slowBody, await slowHead];
  check('a body one byte a second: closed after the timeout', sb.closed && !/^HTTP\/1\.1 200/.test(sb.out) &&
        sb.ms >= 2500 && sb.ms < 9000, sb.ms);
  check('headers one byte a second: closed after the timeout', h.closed && h.out === '' && h.ms >= 2500 &&
        h.ms < 9000, `${h.ms} ms, ${JSON.stringify(h.out.slice(0, 80))}`);

  const long = (n = 200) => fetch(url2 + '/v1/chat/completions', { method: 'POST', headers: auth,
    body: JSON.stringify({ model: env.model, messages, max_tokens: n, ignore_eos: true, stream: true }) });
  // a client that goes away while its request waits for the slot: counted as
  // aborted like one whose generation runs (the role chunk goes out first)
  const metric2 = (name) => metric(name, url2);
  // until the second server's metric reads v (at most 5 s)
  const until = async (name, v) => {
    for (let i = 0; i < 500 && (await metric2(name)) !== v; i++) await new Promise((r) => setTimeout(r, 10));
  };
  const tOccupier = performance.now();
  const occupier = await long(240);
  await until('whale_slots_busy', 1);
  const aborted0 = await metric2('whale_requests_aborted_total');
  const queuedBody = JSON.stringify({ model: env.model, messages, max_tokens: 8, stream: true });
  let depth = NaN, seen = false;
  await raw([head(Buffer.byteLength(queuedBody)) + queuedBody], {
    port: port2, timeoutMs: 10000,
    onData: async (out, sock) => {
      if (seen || !out.includes('"content":"')) return;
      seen = true;
      depth = await metric2('whale_queue_depth');
      sock.destroy();
    } });
  let aborted1 = aborted0;
  for (let i = 0; i < 100 && aborted1 === aborted0; i++) {
    await new Promise((r) => setTimeout(r, 20));
    aborted1 = await metric2('whale_requests_aborted_total');
  }
  const occupied = await occupier.text().catch(() => '(connection closed)');
  const occupierSeconds = (performance.now() - tOccupier) / 1000;
  check('disconnect while queued: counted as aborted', aborted1 === aborted0 + 1, `${aborted0} -> ${aborted1}`);
  check('disconnect while queued: it had waited, the running stream ends', depth === 1 &&
        occupied.trimEnd().endsWith('data: [DONE]'), `queue depth ${depth}`);
  check('disconnect while queued: nothing left behind', (await metric2('whale_slots_busy')) === 0 &&
        (await metric2('whale_queue_depth')) === 0);

  // one slot and a queue of one: the third request is turned away. Each is
  // sent once the server's metrics show the one before it running or queued,
  // and the first asks for about two seconds of tokens at the rate the
  // occupier above was served (64 to 1,500), so it cannot end before the
  // third arrives however fast or slow the machine is, and the drain below
  // does not wait minutes on a slow one
  const runTokens = Math.max(64, Math.min(1500, Math.round(2 * 240 / occupierSeconds)));
  const running = await long(runTokens);
  await until('whale_slots_busy', 1);
  const queued = await long(8);
  await until('whale_queue_depth', 1);
  const third = await long(8);
  const kept = [running, queued];
  check('queue full: 503 with Retry-After', third.status === 503 && kept.every((r) => r.status === 200) &&
        third.headers.get('retry-after') === '1',
        `${[running, queued, third].map((r) => r.status).join(' ')} (the first asked for ${runTokens} tokens)`);
  await third.text();
  // SIGTERM: the running and queued streams finish, then the process exits
  process.kill(Number(process.env.SERVE_PID2), 'SIGTERM');
  await new Promise((r) => setTimeout(r, 200));
  const health = await fetch(url2 + '/health').then((r) => r.status, () => 'closed');
  check('draining: /health says 503', health === 503 || health === 'closed', health);
  const refused = await fetch(url2 + '/v1/chat/completions', { method: 'POST', headers: auth,
    body: JSON.stringify({ model: env.model, messages }) }).then((r) => r.status, () => 'closed');
  check('draining: new requests are refused', refused === 503 || refused === 'closed', refused);
  const texts = await Promise.all(kept.map((r) => r.text().catch(() => '(connection closed)')));
  check('draining: running and queued streams end with [DONE]',
        texts.length === 2 && texts.every((t) => t.trimEnd().endsWith('data: [DONE]')));
}
finish('serve-hostile');
