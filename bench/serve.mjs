// Throughput and latency of a running `whale serve` at several concurrencies
// (node, no packages): N streams at once, each a different prompt, greedy,
// a fixed number of tokens (ignore_eos). Per concurrency: aggregate tokens/s
// (all generated tokens over the wall time of the round, prefill included),
// aggregate decode tokens/s (each stream's tokens after its first over the time
// from its first token to its last, summed over the streams), time to first token
// and inter-token latency (p50, p99), the server's mean time per step (a
// batched forward and its sampling, /metrics) and the most sequences it put
// in one forward. Speed is measured, never asserted.
//
//   node bench/serve.mjs URL MODEL[,MODEL...] [TOKENS (64)] [CONCURRENCIES (1,4,8,16)] [KEY]
//   (several models, e.g. the base and its adapters: stream i asks for the
//   i-th, round robin)
//   e.g. build/whale serve -m model --parallel 16 --ctx-size 512 &
//        node bench/serve.mjs http://127.0.0.1:8080 model 64 1,4,8,16
import http from 'node:http';
const [url, model, tokensArg, concArg, key] = process.argv.slice(2);
if (!url || !model) {
  console.error('usage: node bench/serve.mjs URL MODEL[,MODEL...] [TOKENS] [CONCURRENCIES] [KEY]');
  process.exit(2);
}
const models = model.split(',');
const tokens = Number(tokensArg ?? 64);
const concurrencies = (concArg ?? '1,4,8,16').split(',').map(Number);
const headers = { 'Content-Type': 'application/json', ...(key ? { Authorization: `Bearer ${key}` } : {}) };

// node:http rather than fetch: the client shares the machine's cores with the
// server, and fetch's web streams cost it 116 us of processor time per token
// against 69 (8 streams of 512 tokens, per-token difference of a long and a short run)
const agent = new http.Agent({ keepAlive: true });
function stream(i) {
  const body = JSON.stringify({
    model: models[(i + models.length) % models.length], prompt: `Stream ${i}: once upon a time there was a whale that`, max_tokens: tokens, temperature: 0,
    ignore_eos: true, stream: true, stream_options: { include_usage: true } });
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const times = [];
    let n = 0, buf = '', tEnd = NaN;
    const req = http.request(url + '/v1/completions', { method: 'POST', agent,
      headers: { ...headers, 'Content-Length': Buffer.byteLength(body) } }, (r) => {
      r.setEncoding('utf8');
      if (r.statusCode !== 200) {
        let text = '';
        r.on('data', (d) => (text += d));
        r.on('end', () => reject(new Error(`HTTP ${r.statusCode}: ${text}`)));
        return;
      }
      r.on('data', (part) => {
        buf += part;
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, k);
          buf = buf.slice(k + 2);
          if (!ev.startsWith('data: {')) continue;
          const c = JSON.parse(ev.slice(6));
          if (c.usage) n = c.usage.completion_tokens, tEnd = performance.now();
          else if (c.choices[0]?.text) times.push(performance.now());
        }
      });
      r.on('end', () => resolve({ t0, times, n, tEnd }));
      r.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

const pct = (a, p) => (a.length ? a[Math.min(a.length - 1, Math.floor((p / 100) * a.length))] : NaN);
async function metrics(...names) {
  const text = await (await fetch(url + '/metrics', { headers })).text();
  return names.map((name) => {
    const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  });
}
const steps = () => metrics('whale_step_seconds_sum', 'whale_step_seconds_count');

// fetch (for /metrics) first, before the warm-up: node loads it on the first
// call and keeps a core busy for a while after; when that call came between
// two rounds, the server's steps in the next round took 4.5-5 ms instead of
// 1.8 (one stream, nanowhale-100m int8, 2 cores)
await steps();
await stream(-1); // warm up
for (const n of concurrencies) {
  const [s0, c0] = await steps();
  const t0 = performance.now();
  const runs = await Promise.all(Array.from({ length: n }, (_, i) => stream(i)));
  const wall = (performance.now() - t0) / 1000;
  const total = runs.reduce((s, r) => s + r.n, 0);
  const ttft = runs.map((r) => (r.times[0] - r.t0) / 1000).sort((a, b) => a - b);
  // decode alone: each stream's tokens after its first over the time from its
  // first text to its usage chunk, summed over the streams (they run together)
  const decode = runs.reduce((s, r) => s + (r.n - 1) / ((r.tEnd - r.times[0]) / 1000), 0);
  // the server's own time per batched forward and its sampling over the
  // round (prefill steps included): what the engine did, apart from the
  // HTTP, the streaming and the client that share the machine with it
  const [s1, c1] = await steps();
  const itl = runs.flatMap((r) => r.times.slice(1).map((t, k) => (t - r.times[k]) / 1000)).sort((a, b) => a - b);
  console.log(JSON.stringify({ concurrency: n, tokens: total, seconds: +wall.toFixed(3),
    aggregate_tokens_per_s: +(total / wall).toFixed(1), decode_tokens_per_s: +decode.toFixed(1), ttft_p50_ms: +(pct(ttft, 50) * 1e3).toFixed(1),
    ttft_p99_ms: +(pct(ttft, 99) * 1e3).toFixed(1), itl_p50_ms: +(pct(itl, 50) * 1e3).toFixed(2),
    itl_p99_ms: +(pct(itl, 99) * 1e3).toFixed(2), step_ms: +(((s1 - s0) / (c1 - c0)) * 1e3).toFixed(3),
    batch_sequences_max: (await metrics('whale_batch_sequences_max'))[0] }));
}
