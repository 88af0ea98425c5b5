// Shared by the whale serve tests: checks, a raw HTTP client, the CLI.
import fs from 'node:fs';
import net from 'node:net';
import { execFileSync } from 'node:child_process';

export const env = {
  url: process.env.SERVE_URL, // http://127.0.0.1:PORT
  key: process.env.SERVE_KEY,
  model: process.env.SERVE_MODEL, // the id requests name
  dir: process.env.SERVE_DIR, // the model folder
  whale: process.env.WHALE,
  tmp: process.env.TMP,
  pid: Number(process.env.SERVE_PID),
  sanitized: process.env.WHALE_SANITIZED === '1' || process.env.WHALE_SANITIZED === 'TRUE',
  // the server's --adapters, "NAME=DIR,NAME=DIR": [{name, dir}]
  adapters: (process.env.SERVE_ADAPTERS ?? '').split(',').filter(Boolean)
    .map((a) => ({ name: a.slice(0, a.indexOf('=')), dir: a.slice(a.indexOf('=') + 1) })),
};
const port = Number(new URL(env.url).port);

let checks = 0, fails = 0;
export function check(what, ok, detail) {
  checks++;
  if (!ok) {
    fails++;
    console.log(`FAIL: ${what}${detail === undefined ? '' : ': ' + detail}`);
  }
}
export function finish(name) {
  console.log(`${name}: ${checks - fails} passed, ${fails} failed`);
  process.exit(fails ? 1 : 0);
}

export const auth = { Authorization: `Bearer ${env.key}` };

// fetch with the key (from the server at `url`); returns {status, headers, json|text}
export async function call(path, body, { headers = auth, method, url = env.url } = {}) {
  const r = await fetch(url + path, {
    method: method ?? (body === undefined ? 'GET' : 'POST'),
    headers: { 'Content-Type': 'application/json', ...headers },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json;
  try { json = JSON.parse(text); } catch { json = undefined; }
  return { status: r.status, headers: r.headers, text, json };
}

// A raw request over a socket: write `chunks` (strings/Buffers, `gapMs` apart),
// collect what comes back until the server closes or `timeoutMs`
// (`closeWhen`: close the socket once this async function, called after the
// last write went out, resolves); resolves to {out, closed, ms}.
export function raw(chunks, { gapMs = 0, timeoutMs = 10000, onData, closeWhen, port: to = port } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect(to, '127.0.0.1'), t0 = Date.now();
    let out = '', closed = false;
    const timer = setTimeout(() => { sock.destroy(); resolve({ out, closed: false, ms: Date.now() - t0 }); }, timeoutMs);
    sock.on('data', (d) => { out += d; if (onData) onData(out, sock); });
    sock.on('close', () => { closed = true; clearTimeout(timer); resolve({ out, closed, ms: Date.now() - t0 }); });
    sock.on('error', () => {});
    (async () => {
      for (const c of chunks) {
        if (sock.destroyed) return;
        await new Promise((r) => sock.write(c, r));
        if (gapMs) await new Promise((r) => setTimeout(r, gapMs));
      }
      if (closeWhen) {
        await closeWhen();
        sock.destroy();
      }
    })();
  });
}

export function whale(...args) {
  return execFileSync(env.whale, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
}

export async function metric(name, url = env.url) {
  const r = await call('/metrics', undefined, { url });
  const m = r.text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
}

export function rssKiB(pid) {
  const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/);
  return m ? Number(m[1]) : NaN;
}
